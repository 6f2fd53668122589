"""The knowledge base as data: rule files (`rules_*.json` next to this module), their schema and loader.

A rule file is `{"version": 1, "rules": [rule, ...]}`; a rule is

    {"id": "http-401-env-name-as-key", "category": "key", "severity": "error", "priority": 95,
     "title": "...", "when": <condition>, "boost_if": <condition, optional>, "boost": 15,
     "cause": "...", "evidence": "template with {facts}", "fix": "template with {facts}",
     "references": ["https://..."]}

A condition is `{"all": [c, ...]}`, `{"any": [c, ...]}`, `{"not": c}` or one predicate:
`{"status_in": [401]}` (a scalar/list binds the predicate's single argument), `{"network": {"kind": "dns"}}`
(keyword arguments) or `{"error_present": true}` (no arguments). Loading checks everything — JSON syntax,
fields, unknown predicates (with a "did you mean"), their arguments, regexes, template placeholders and
duplicate ids — and raises one `RuleFileError` listing every problem with file and rule id.
"""
from __future__ import annotations

import difflib
import inspect
import json
import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .predicates import FACTS, PREDICATES

RULES_DIR = Path(__file__).parent
SEVERITY_WEIGHT = {"critical": 30, "error": 20, "warning": 10, "info": 0}
Category = Literal["http", "network", "key", "url", "config", "code", "training", "run"]


class Rule(BaseModel):
    """One entry of the knowledge base."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9]+(?:[-.][a-z0-9]+)*$")
    category: Category
    severity: Literal["critical", "error", "warning", "info"]
    priority: int = Field(50, ge=0, le=100)
    """Base of the ranking score; specific rules rank above generic ones."""
    title: str = Field(min_length=3, max_length=160)
    when: dict[str, Any]
    boost_if: dict[str, Any] | None = None
    """Optional condition that, when it also holds, adds `boost` to the score and its evidence."""
    boost: int = Field(15, ge=0, le=100)
    cause: str = Field(min_length=3)
    evidence: str = Field(min_length=3)
    fix: str = Field(min_length=3)
    references: list[str] = Field(default_factory=list)


class RuleFileError(ValueError):
    """A rule file cannot be used; lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid diagnostics rule file(s):\n" + "\n".join(f"  - {p}" for p in problems))


def leaf_args(fn, value: Any) -> dict[str, Any]:
    """The keyword arguments a condition leaf passes to its predicate."""
    if value is True:
        return {}
    if isinstance(value, dict):
        return value
    params = list(inspect.signature(fn).parameters)[1:]
    return {params[0]: value} if len(params) == 1 else {"__positional__": value}


def check_condition(cond: Any, where: str) -> list[str]:
    """Problems of a condition tree (empty list = valid)."""
    if not isinstance(cond, dict) or len(cond) != 1:
        return [(f"{where}: a condition is an object with exactly one key (all/any/not or a predicate name), "
                 f"got {json.dumps(cond)[:80]}")]
    (name, value), = cond.items()
    if name in ("all", "any"):
        if not isinstance(value, list) or not value:
            return [f"{where}: '{name}' needs a non-empty list of conditions"]
        return [p for i, c in enumerate(value) for p in check_condition(c, f"{where}.{name}[{i}]")]
    if name == "not":
        return check_condition(value, f"{where}.not")
    fn = PREDICATES.get(name)
    if fn is None:
        close = difflib.get_close_matches(name, list(PREDICATES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(PREDICATES))})"
        return [f"{where}: unknown predicate {name!r}{hint}"]
    if value is False or value is None:
        return [f"{where}: predicate {name!r} needs true, an argument or an object of arguments"]
    args = leaf_args(fn, value)
    if "__positional__" in args:
        return [f"{where}: predicate {name!r} takes several arguments; give them as an object"]
    try:
        inspect.signature(fn).bind(None, **args)
    except TypeError as e:
        return [f"{where}: bad arguments for {name!r}: {e}"]
    if isinstance(args.get("pattern"), str):
        try:
            re.compile(args["pattern"])
        except re.error as e:
            return [f"{where}: invalid regex for {name!r}: {e}"]
    return []


def _template_problems(rule: Rule, where: str) -> list[str]:
    out = []
    for field_name in ("evidence", "fix", "cause", "title"):
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(getattr(rule, field_name)) if f]
        except ValueError as e:
            out.append(f"{where}: {field_name} is not a valid template ({e})")
            continue
        out += [f"{where}: {field_name} uses unknown fact {{{n}}} (known: {', '.join(sorted(FACTS))})"
                for n in names if n not in FACTS]
    return out


def parse_rule_file(text: str, name: str) -> tuple[list[Rule], list[str]]:
    """Rules of one file and the problems found (pure: no file access)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return [], [f"{name}:{e.lineno}:{e.colno}: JSON syntax error: {e.msg}"]
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        return [], [f"{name}: expected an object {{\"version\": 1, \"rules\": [...]}}"]
    rules, problems = [], []
    for i, raw in enumerate(data["rules"]):
        rid = raw.get("id", f"#{i}") if isinstance(raw, dict) else f"#{i}"
        where = f"{name}: rule {rid}"
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as e:
            problems += [f"{where}: {'.'.join(map(str, err['loc'])) or 'rule'}: {err['msg']}" for err in e.errors()]
            continue
        found = check_condition(rule.when, f"{where}: when")
        if rule.boost_if is not None:
            found += check_condition(rule.boost_if, f"{where}: boost_if")
        found += _template_problems(rule, where)
        problems += found
        if not found:
            rules.append(rule)
    return rules, problems


def load_rules(paths: list[str | Path] | None = None) -> list[Rule]:
    """Load and validate rule files (default: every `rules_*.json` of this package); raise `RuleFileError`."""
    if paths is None:
        return list(_default_rules())
    return _load(tuple(Path(p) for p in paths))


@lru_cache(maxsize=1)
def _default_rules() -> tuple[Rule, ...]:
    return tuple(_load(tuple(sorted(RULES_DIR.glob("rules_*.json")))))


def _load(paths: tuple[Path, ...]) -> list[Rule]:
    rules, problems, seen = [], [], {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            problems.append(f"{path}: cannot read ({e})")
            continue
        file_rules, file_problems = parse_rule_file(text, str(path))
        problems += file_problems
        for r in file_rules:
            if r.id in seen:
                problems.append(f"{path}: rule {r.id}: duplicate id (also in {seen[r.id]})")
            seen[r.id] = str(path)
            rules.append(r)
    if problems:
        raise RuleFileError(problems)
    return rules
