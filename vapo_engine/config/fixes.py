"""The "Fix:" of a value of the wrong shape: it shows the shape the key expects (a list, a table, a whole number,
a number, true/false, a quoted string) written the way the value came in — a `--set key=value` override or a
`key = value` line of the file — with an example built from the default or from what was given.

Used by `loader._issue` for pydantic's type errors; range and choice errors keep their "allowed: …" fix.
"""
from __future__ import annotations

import json
from typing import Any

SHAPES = {"list_type": "list", "tuple_type": "list", "model_type": "table", "dict_type": "table",
          "model_attributes_type": "table", "int_type": "integer", "int_parsing": "integer",
          "int_from_float": "integer", "float_type": "number", "float_parsing": "number", "bool_type": "bool",
          "bool_parsing": "bool", "string_type": "string"}
"""pydantic error type → the shape the key expects."""
_WHAT = {"list": "a list in [ ]", "table": "a table of keys, not a single value", "integer": "a whole number",
         "number": "a number", "bool": "true or false", "string": "a quoted string"}


def toml_value(value: Any) -> str:
    """`value` written as TOML (a value of a `--set` override or of a `key = value` line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def expected_shape(err_type: str) -> str | None:
    """What a key of this pydantic error type expects, in words ("a list in [ ]", "a whole number", …)."""
    shape = SHAPES.get(err_type)
    return _WHAT[shape] if shape else None


def shape_fix(key: str, err_type: str, given: Any, *, from_set: bool, default: Any = None,
              table_keys: list[str] | tuple[str, ...] = (), allowed: str = "") -> str | None:
    """The fix for `key` (dotted; a list element as `key[i]`) whose value has the wrong shape, or None when
    `err_type` is not a shape error. `given` is what the user wrote, already safe to show."""
    shape = SHAPES.get(err_type)
    if shape is None:
        return None
    what = _WHAT[shape] + (f" ({allowed})" if allowed and shape in ("integer", "number") else "")
    if shape == "table":
        first = table_keys[0] if table_keys else "KEY"
        keys = f" (keys: {', '.join(table_keys)})" if table_keys else ""
        how = (f"--set {key}.{first}=VALUE, one --set per key" if from_set
               else f"a [{key}] section with one `key = value` line per key")
        return f"set the keys of {key} one by one: {how}{keys}"
    example = _example(shape, given, default)
    if "[" in key:  # an element of a list: the example is the list holding it
        key, example = key.split("[")[0], f"[{example}]"
        what = f"a list of {_WHAT[shape].removeprefix('a ')}s" if shape != "bool" else "a list of true/false"
        return f"write {key} as {what}, e.g. " + _assignment(key, example, from_set)
    return f"write {key} as {what}, e.g. " + _assignment(key, example, from_set)


def _example(shape: str, given: Any, default: Any) -> str:
    if shape == "list":
        if isinstance(default, (list, tuple)) and default:
            return toml_value(default)
        return toml_value([] if given in (None, "", []) else given if isinstance(given, list) else [given])
    if shape == "integer":
        return toml_value(default if isinstance(default, int) and not isinstance(default, bool) else 1)
    if shape == "number":
        return toml_value(default if isinstance(default, (int, float)) and not isinstance(default, bool) else 0.5)
    if shape == "bool":
        return "true" if not isinstance(default, bool) else toml_value(default)
    text = default if isinstance(default, str) and default else given if given not in (None, "") else "text"
    return toml_value(str(text))


def _assignment(key: str, example: str, from_set: bool) -> str:
    if from_set:
        return f"--set '{key}={example}'" if any(c in example for c in " [\"'") else f"--set {key}={example}"
    section, _, leaf = key.rpartition(".")
    return f"{leaf} = {example}" + (f" under [{section}]" if section else "")
