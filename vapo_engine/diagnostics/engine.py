"""The pure evaluator: rules × evidence → ranked findings (cause, evidence, fix).

score = rule.priority + severity weight (critical 30, error 20, warning 10, info 0) + 3 per matched
predicate + rule.boost when `boost_if` also holds. Findings are sorted by score (ties: rule id) and bounded.
No I/O here: the same evidence always gives the same diagnosis.

A pasted error is explained first. When the caller handed over an error (`Evidence.pasted`: a status, body,
headers or log text from *their* program) the rules run twice: on the caller's view (the evidence without this
server's own key, base URL, proxy variables and config files — `Evidence.caller_view`) and on everything. What
the pasted error supports leads (scope "given", worded from the caller's view, so it never quotes this server's
key or URL as if the error came from them); what needs the server's own facts follows, with scope
"server_channel" and the title prefixed "this server's channel: ", and is never the summary's headline.
"""
from __future__ import annotations

import logging
import string
from typing import Any, Literal

from pydantic import BaseModel, Field

from .evidence import Evidence
from .predicates import FACTS, PREDICATES
from .rules import SEVERITY_WEIGHT, Rule, leaf_args, load_rules

log = logging.getLogger("vapo_engine.diagnostics")
MAX_TEXT = 600
SERVER_PREFIX = "this server's channel: "
BORROWED_FACTS = ("api_key_env", "fallback_model")
"""Names from the project's settings that a finding about a pasted error may still quote (they name things,
they say nothing about the error): `export TAOTOKEN_API_KEY=…` reads better than a placeholder."""
UNKNOWN_FACT = {
    "base_url": "your base URL",
    "normalised_url": "the base URL ending in /v1 (no trailing slash, no /chat/completions)",
    "host": "<the host of your base URL>",
    "key_redacted": "(the key that was sent)",
    "key_source": "your program's environment",
    "model": "(the requested model)",
    "retry_after": "not given",
    "close_matches": "see GET /models",
    "error_message": "(no message)",
}
"""How a finding about a pasted error words a fact it does not know (instead of `<name>`)."""


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
    scope: Literal["given", "server_channel"] = "given"
    """"server_channel": a fact about this server's own channel/files, not about the error the caller gave."""


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


def _fact(name: str, ev: Evidence | None) -> str | None:
    try:
        value = FACTS[name](ev) if ev is not None and name in FACTS else None
    except Exception:  # noqa: BLE001
        value = None
    return None if value in (None, "") else str(value)


class _Facts(dict):
    def __init__(self, ev: Evidence, full: Evidence | None = None):
        super().__init__()
        self.ev, self.full = ev, full

    def __missing__(self, name: str) -> str:
        value = _fact(name, self.ev)
        if value is None and self.full is not None and name in BORROWED_FACTS:
            value = _fact(name, self.full)
        if value is None:
            value = UNKNOWN_FACT.get(name) or f"(no {name.replace('_', ' ')} known)"
        return value


def render(template: str, ev: Evidence, full: Evidence | None = None) -> str:
    """Fill `{fact}` placeholders; a fact the evidence does not hold gets a plain wording (`UNKNOWN_FACT`, else
    "(no <name> known)"), never a placeholder. With `full` (when `ev` is the caller's view of a pasted error)
    a few names are borrowed from it."""
    return string.Formatter().vformat(template, (), _Facts(ev, full))[:MAX_TEXT]


def _findings(ev: Evidence, rules: list[Rule], full: Evidence | None = None) -> list[Finding]:
    """Every rule that holds on `ev`, scored and rendered, best first."""
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
        head = render(rule.evidence, ev, full)
        evidence = [head, *dict.fromkeys(s[:MAX_TEXT] for s in said if s not in head)][:8]
        out.append(Finding(rule_id=rule.id, severity=rule.severity, category=rule.category,
                           title=render(rule.title, ev, full), cause=render(rule.cause, ev, full),
                           evidence=evidence, fix=render(rule.fix, ev, full), references=list(rule.references),
                           score=float(score)))
    out.sort(key=lambda f: (-f.score, f.rule_id))
    return out


def evaluate(ev: Evidence, rules: list[Rule] | None = None, *, limit: int = 10) -> list[Finding]:
    """All matching rules as findings, best first, at most `limit`; for a pasted error, the findings it
    supports first and this server's own channel facts after them, labelled (see the module docstring)."""
    rules = load_rules() if rules is None else rules
    if not (ev.pasted and ev.server_facts):
        return _findings(ev, rules)[:limit]
    given = _findings(ev.caller_view(), rules, full=ev)
    seen = {f.rule_id for f in given}
    server = [f.model_copy(update={"scope": "server_channel", "title": (SERVER_PREFIX + f.title)[:MAX_TEXT]})
              for f in _findings(ev, rules) if f.rule_id not in seen]
    return (given + server)[:limit]


def diagnose(ev: Evidence, rules: list[Rule] | None = None, *, limit: int = 10) -> Diagnosis:
    """`evaluate` wrapped with a one-line summary and what evidence was available."""
    rules = load_rules() if rules is None else rules
    every = evaluate(ev, rules, limit=len(rules) + 1)
    top = every[:limit]
    if top and top[0].scope == "server_channel":
        summary = ("no known problem matched the error you gave; the findings are about this server's own "
                   f"channel, not your error (first: {top[0].title.removeprefix(SERVER_PREFIX)})")
    elif top:
        f = top[0]
        summary = f"{f.title} — {f.fix}"
    else:
        summary = ("no known problem matched the evidence given" if ev.inputs else
                   "no evidence given: pass a status code, an error body, a log/traceback, config files or code")
    return Diagnosis(findings=top, summary=summary[:MAX_TEXT], inputs=list(ev.inputs),
                     rules_evaluated=len(rules), truncated=len(every) > limit)
