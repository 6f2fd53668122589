"""Tool-argument errors in the project's language: the argument, what was wrong, what is allowed, what to do.

The MCP SDK validates a call's arguments against the tool's pydantic model and, on failure, hands the agent
pydantic's own text ("1 validation error for report_metricsArguments … [type=less_than_equal, …] For further
information visit …"); unknown arguments are dropped silently. `server.app.VapoMCPServer` turns both into one
message per argument, built here from the pydantic error and the tool's published input schema, e.g.

    argument 'limit' = 900 is out of range: allowed 1–500; call again with a smaller limit

Values are shown only when short, and scrubbed (a key pasted into an argument must not come back).
"""
from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, ValidationError

from vapo_engine.providers import scrub

RANGE = {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}
TOO_LONG, TOO_SHORT = {"string_too_long", "too_long"}, {"string_too_short", "too_short"}
CHOICE = {"literal_error", "enum"}
SPECIFIC = RANGE | TOO_LONG | TOO_SHORT | CHOICE | {"string_pattern_mismatch", "missing"}

RunId = Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             description="a run id from start_training / list_runs (or an ablation id abl-…)")]
"""A run id as every tool and resource takes it: no path separators, no leading dot, so never a path."""


def unknown_tool(name: str, names: list[str]) -> str:
    return f"unknown tool {show(name)}: call one of {', '.join(names)} (list_tools describes each)"


def unknown_prompt(name: str, names: list[str]) -> str:
    return f"unknown prompt {show(name)}: ask for one of {', '.join(names)} (prompts/list describes each)"


def missing_prompt_argument(prompt: str, arg: str, description: str | None) -> str:
    desc = f" ({description})" if description else ""
    return f"argument {arg!r} is required{desc}: call prompts/get {prompt} again with {arg} set"


def unexpected_arguments(tool: str, given: dict, schema: dict) -> str | None:
    """A message for arguments the tool does not take (the SDK would ignore them silently), else None."""
    props = schema.get("properties") or {}
    extra = [k for k in given if k not in props]
    if not extra:
        return None
    takes = ", ".join(props) or "no arguments"
    return (f"unexpected argument(s) {', '.join(map(show, extra))} for {tool}: it takes only {takes}; "
            "call again without them")


def describe_validation(tool: str, exc: ValidationError, schema: dict) -> str:
    """One line per argument that failed, in the order the tool declares its arguments."""
    by_arg: dict[str, list[dict]] = {}
    for err in exc.errors(include_url=False):
        by_arg.setdefault(str(err["loc"][0]) if err["loc"] else "?", []).append(err)
    props = _deref(schema.get("properties") or {}, schema.get("$defs") or {})
    order = sorted(by_arg, key=lambda a: list(props).index(a) if a in props else len(props))
    lines = [_one(tool, arg, by_arg[arg], props.get(arg) or {}) for arg in order]
    return lines[0] if len(lines) == 1 else f"{len(lines)} invalid arguments for {tool}:\n" + \
        "\n".join(f"  - {line}" for line in lines)


def _one(tool: str, arg: str, errs: list[dict], prop: dict) -> str:
    """The message for one argument: the most specific error wins over type mismatches of union branches."""
    err = next((e for e in errs if e["type"] in SPECIFIC), errs[0])
    name, sub = _where(arg, err["loc"][1:], prop)
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    what = f"argument {name!r}"
    desc = f" ({_description(prop)})" if _description(prop) else ""
    if kind == "missing":
        return f"{what} is required{desc}: call {tool} again with {arg} set"
    if kind == "extra_forbidden":
        parent, _ = _where(arg, err["loc"][1:-1], prop)
        fields = next((list(o["properties"]) for o in _options(_where(arg, err["loc"][1:-1], prop)[1])
                       if "properties" in o), [])
        return (f"{what} is not a field of {parent!r}: it takes only {', '.join(fields)}; call again "
                "without it")
    if kind in RANGE:
        lo, hi = _bounds(sub)
        big = kind.startswith("less")
        return (f"{what} = {show(value)} is out of range: allowed {_range(lo, hi)}; call again with a "
                f"{'smaller' if big else 'larger'} {name}")
    if kind in TOO_LONG:
        return _too_long(what, arg, kind, ctx, value)
    if kind in TOO_SHORT:
        unit = "character" if kind.startswith("string") else "item"
        return f"{what} is empty: it needs at least {ctx.get('min_length', 1)} {unit}(s); pass a non-empty {arg}"
    if kind in CHOICE:
        allowed = ", ".join(map(str, _enum(sub))) or ctx.get("expected", "")
        return f"{what} = {show(value)} is not an allowed value: allowed {allowed}; call again with one of them"
    if kind == "string_pattern_mismatch":
        return (f"{what} = {show(value)} has the wrong form: allowed values match {ctx.get('pattern')}{desc}; "
                "call again with a value of that form")
    if kind.endswith(("_type", "_parsing", "_from_float")) or kind in ("union_tag_invalid", "model_type"):
        expected = _expected(sub)
        return f"{what} = {show(value)} has the wrong type: expected {expected}; call again with {expected}"
    return (f"{what} = {show(value)} is invalid ({err.get('msg', kind)}); allowed: {_expected(sub)}; call again "
            "with a valid value")


def _too_long(what: str, arg: str, kind: str, ctx: dict, value: Any) -> str:
    limit = ctx.get("max_length")
    if kind == "string_too_long":
        n = len(value) if isinstance(value, str) else "?"
        return (f"{what} is too long ({n} characters): allowed at most {limit} characters; call again with a "
                f"shorter {arg}")
    n = ctx.get("actual_length") or (len(value) if hasattr(value, "__len__") else "?")
    return (f"{what} has too many items ({n}): allowed at most {limit}; call again with fewer (split the work "
            "over several calls)")


def _where(arg: str, rest: tuple, prop: dict) -> tuple[str, dict]:
    """'overrides[3]' / "headers['X']" and the schema of that spot; union-branch tags in `rest` are skipped."""
    name, sub = arg, prop
    for part in rest:
        options = _options(sub)
        if isinstance(part, int):
            name += f"[{part}]"
            sub = next((o.get("items") or {} for o in options if o.get("type") == "array"), {})
        elif any(isinstance(o.get("properties"), dict) for o in options):  # a nested model: 'provider.model'
            name += f".{part}"
            sub = next(o["properties"] for o in options if isinstance(o.get("properties"), dict)).get(part) or {}
        elif any(isinstance(o.get("additionalProperties"), dict) for o in options):
            name += f"[{part!r}]"
            sub = next(o["additionalProperties"] for o in options if isinstance(o.get("additionalProperties"), dict))
    return name, sub


def _deref(node: Any, defs: dict, depth: int = 0) -> Any:
    """`node` with every {"$ref": "#/$defs/X"} replaced by the definition (nested models of the schema)."""
    if depth > 8:
        return node
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            return _deref({**defs[ref[8:]], **{k: v for k, v in node.items() if k != "$ref"}}, defs, depth + 1)
        return {k: _deref(v, defs, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_deref(v, defs, depth + 1) for v in node]
    return node


def _description(prop: dict) -> str:
    return prop.get("description") or next((o["description"] for o in _options(prop) if o.get("description")), "")


def _options(schema: dict) -> list[dict]:
    """The non-null alternatives of a schema (anyOf flattened)."""
    opts = schema.get("anyOf") or [schema]
    return [o for o in opts if o.get("type") != "null"] or [schema]


def _bounds(schema: dict) -> tuple[Any, Any]:
    for o in _options(schema):
        lo = o.get("minimum", o.get("exclusiveMinimum"))
        hi = o.get("maximum", o.get("exclusiveMaximum"))
        if lo is not None or hi is not None:
            return lo, hi
    return None, None


def _range(lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f"{lo}–{hi}"
    return f"≥ {lo}" if lo is not None else f"≤ {hi}"


def _enum(schema: dict) -> list:
    return next((o["enum"] for o in _options(schema) if "enum" in o), [])


_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true/false",
               "object": "an object", "array": "a list", "null": "null"}


def _expected(schema: dict) -> str:
    """'an integer', 'a list of strings', 'a string, an object, a list or null' … from the JSON schema."""
    words = []
    for o in schema.get("anyOf") or [schema]:
        word = _TYPE_WORDS.get(o.get("type"), "a value")
        if o.get("type") == "array" and (o.get("items") or {}).get("type"):
            word = f"a list of {o['items']['type']}s"
        if o.get("type") == "object" and isinstance(o.get("additionalProperties"), dict):
            word = f"an object of {o['additionalProperties'].get('type', 'value')}s"
        if word not in words:
            words.append(word)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def show(value: Any) -> str:
    """A short, scrubbed rendering of a caller's value (long ones are described, not echoed)."""
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return repr(scrub(value)) if len(value) <= 60 else f"a {len(value)}-character string"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    return f"a {type(value).__name__}"
