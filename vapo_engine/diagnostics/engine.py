"""The pure evaluator: rules × evidence → ranked findings (cause, evidence, fix).

score = rule.priority + severity weight (critical 30, error 20, warning 10, info 0) + 3 per matched
predicate + rule.boost when `boost_if` also holds. Findings are sorted by score (ties: rule id) and bounded.
No I/O here: the same evidence always gives the same diagnosis.
"""
from __future__ import annotations

import logging
import string
from typing import Any

from pydantic import BaseModel, Field

from .evidence import Evidence
from .predicates import FACTS, PREDICATES
from .rules import SEVERITY_WEIGHT, Rule, leaf_args, load_rules

log = logging.getLogger("vapo_engine.diagnostics")
MAX_TEXT = 600


class Finding(BaseModel):
    """One matched rule, with the concrete evidence that matched it."""

    rule_id: str
    severity: str
    category: str
    title: str
    cause: str
    evidence: list[str] = Field(default_factory=list)
    fix: str
    references: list[str] = Field(default_factory=list)
    score: float


class Diagnosis(BaseModel):
    """Ranked findings; `summary` is the top one in a sentence (or says nothing matched)."""

    findings: list[Finding] = Field(default_factory=list)
    summary: str = ""
    inputs: list[str] = Field(default_factory=list)
    rules_evaluated: int = 0
    truncated: bool = False


def _match(cond: dict[str, Any], ev: Evidence) -> tuple[bool, list[str], int]:
    """(holds, evidence sentences, number of matched predicates) of a condition tree."""
    (name, value), = cond.items()
    if name == "all":
        parts = [_match(c, ev) for c in value]
        if all(p[0] for p in parts):
            return True, [s for p in parts for s in p[1]], sum(p[2] for p in parts)
        return False, [], 0
    if name == "any":
        parts = [p for p in (_match(c, ev) for c in value) if p[0]]
        return (True, [s for p in parts for s in p[1]], sum(p[2] for p in parts)) if parts else (False, [], 0)
    if name == "not":
        return (not _match(value, ev)[0]), [], 0
    fn = PREDICATES[name]
    try:
        said = fn(ev, **leaf_args(fn, value))
    except Exception as e:  # noqa: BLE001 - a broken predicate must not hide the other findings
        log.debug("predicate %s failed: %s", name, e)
        return False, [], 0
    return (said is not None), ([said] if said else []), (1 if said is not None else 0)


class _Facts(dict):
    def __init__(self, ev: Evidence):
        super().__init__()
        self.ev = ev

    def __missing__(self, name: str) -> str:
        try:
            value = FACTS[name](self.ev) if name in FACTS else None
        except Exception:  # noqa: BLE001
            value = None
        return str(value) if value not in (None, "") else f"<{name}>"


def render(template: str, ev: Evidence) -> str:
    """Fill `{fact}` placeholders; unknown values show as `<fact>`."""
    return string.Formatter().vformat(template, (), _Facts(ev))[:MAX_TEXT]


def evaluate(ev: Evidence, rules: list[Rule] | None = None, *, limit: int = 10) -> list[Finding]:
    """All matching rules as findings, best first, at most `limit`."""
    rules = load_rules() if rules is None else rules
    out = []
    for rule in rules:
        ok, said, leaves = _match(rule.when, ev)
        if not ok:
            continue
        score = rule.priority + SEVERITY_WEIGHT[rule.severity] + 3 * leaves
        if rule.boost_if is not None:
            b_ok, b_said, _ = _match(rule.boost_if, ev)
            if b_ok:
                score += rule.boost
                said += [s for s in b_said if s not in said]
        head = render(rule.evidence, ev)
        evidence = [head, *dict.fromkeys(s[:MAX_TEXT] for s in said if s not in head)][:8]
        out.append(Finding(rule_id=rule.id, severity=rule.severity, category=rule.category,
                           title=render(rule.title, ev), cause=render(rule.cause, ev), evidence=evidence,
                           fix=render(rule.fix, ev), references=list(rule.references), score=float(score)))
    out.sort(key=lambda f: (-f.score, f.rule_id))
    return out[:limit]


def diagnose(ev: Evidence, rules: list[Rule] | None = None, *, limit: int = 10) -> Diagnosis:
    """`evaluate` wrapped with a one-line summary and what evidence was available."""
    rules = load_rules() if rules is None else rules
    every = evaluate(ev, rules, limit=len(rules) + 1)
    top = every[:limit]
    if top:
        f = top[0]
        summary = f"{f.title} — {f.fix}"
    else:
        summary = ("no known problem matched the evidence given" if ev.inputs else
                   "no evidence given: pass a status code, an error body, a log/traceback, config files or code")
    return Diagnosis(findings=top, summary=summary[:MAX_TEXT], inputs=list(ev.inputs),
                     rules_evaluated=len(rules), truncated=len(every) > limit)
