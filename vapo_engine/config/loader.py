"""Load config.toml and settings.json into validated models, turning every failure into `ConfigIssue`s.

One loader per file. `--set key=value` overrides go through the same validation and are named as such
in errors. Syntax errors carry line and column; unknown keys get a "did you mean"; range errors give the
allowed range and the default.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ValidationError

from .errors import ConfigError, ConfigIssue, FieldProblem
from .fixes import expected_shape, shape_fix
from .secrets import redact, redact_tokens, safe_override
from .settings_model import Settings
from .train_model import DEFER_CROSS_CHECKS, TrainConfig

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (),
                preset: str | None = None, *, defer_cross_checks: bool = False) -> TrainConfig:
    """Read and validate config.toml, then a preset (a TOML file of overrides), then `key=value`
    overrides (TOML values, dotted keys): later wins. `defer_cross_checks`: cross-field problems do not raise
    (the caller lists them with `TrainConfig.cross_check_problems`)."""
    path = Path(path)
    raw = _read(path, _parse_toml, "--config", "config.toml")
    layer = None
    if preset:
        ppath = preset_path(preset)
        layer = (str(ppath), _read(ppath, _parse_toml, "--preset"))
        raw = _merge(raw, layer[1])
    over = parse_overrides(overrides)
    return validate(TrainConfig, _merge(raw, over), str(path), over, preset=layer,
                    context={DEFER_CROSS_CHECKS: True} if defer_cross_checks else None)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(preset: str) -> Path:
    """A built-in preset name (exactly one of `preset_names()`, so '../x' cannot reach outside the presets
    folder) or a path to a TOML file."""
    p = Path(preset)
    if p.suffix == ".toml" and p.is_file():
        return p
    if preset in preset_names():
        return PRESETS_DIR / f"{preset}.toml"
    if p.suffix == ".toml":  # meant as a file (other strings never touch the disk: tools.access.preset_for)
        _read(p, _parse_toml, "--preset")  # raises: not found, or a folder
    raise ConfigError([ConfigIssue("--preset", preset, "unknown preset", "use one of "
                                   f"{', '.join(preset_names())} or a path to a .toml file")])


def load_settings(path: str | Path) -> Settings:
    """Read and validate settings.json."""
    path = Path(path)
    return validate(Settings, _read(path, _parse_json, "--settings", "settings.json"), str(path), {})


def _read(path: Path, parse, flag: str, shipped: str | None = None) -> dict:
    """The parsed file; a missing file or a folder is one issue naming the path, the flag and the fix."""
    if path.is_dir():
        inside = f" (e.g. {flag} {path / shipped})" if shipped else ""
        raise ConfigError([ConfigIssue(str(path), "", "is a folder, not a file",
                                       f"pass the file itself with {flag}{inside}")])
    if not path.is_file():
        fix = (f"create it (copy the commented {shipped} the repository ships) or pass an existing file with {flag}"
               if shipped else f"pass an existing .toml file of overrides or a built-in preset name "
               f"({', '.join(preset_names())}) with {flag}")
        raise ConfigError([ConfigIssue(str(path), "", ("preset " if flag == "--preset" else "") + "file not found",
                                       fix)])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([ConfigIssue(str(path), "", f"cannot read file ({e})", "save it as UTF-8 text")]) from None
    data = parse(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(str(path), "", "top level must be an object/table",
                                       "wrap the keys in { ... }")])
    return data


def _parse_toml(text: str, name: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line, col = _toml_position(str(e))
        msg = _toml_message(str(e))
        raise ConfigError([ConfigIssue(name, "", f"TOML syntax error: {msg}", "fix the syntax at that line "
                                       '(strings need quotes, one key = value per line)', line=line,
                                       column=col)]) from None


# tomllib messages that quote the file (a key, a character); the error names line and column instead
_TOML_QUOTING = (
    ("Cannot declare", "a table is declared twice"),
    ("Duplicate inline table key", "a key is repeated in an inline table"),
    ("Cannot mutate immutable namespace", "a key extends an inline table or array defined earlier"),
    ("Cannot redefine namespace", "a table redefines a key"),
    ("Found invalid character", "invalid character"),
    ("Illegal character", "illegal character"),
)


def _toml_message(text: str) -> str:
    """tomllib's message without the position suffix and without any text quoted from the file."""
    msg, _, where = text.partition(" (at ")
    suffix = " (at end of document)" if where.startswith("end of document") else ""
    for prefix, neutral in _TOML_QUOTING:
        if msg.startswith(prefix):
            return neutral + suffix
    return msg + suffix


def _toml_position(msg: str) -> tuple[int | None, int | None]:
    import re
    m = re.search(r"line (\d+), column (\d+)", msg)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([ConfigIssue(name, "", f"JSON syntax error: {e.msg}", "fix the syntax there "
                                       "(double quotes, no trailing commas, no comments)", line=e.lineno,
                                       column=e.colno)]) from None


def parse_overrides(items) -> dict:
    """`["vapo.alpha=0.5", "training.algorithm=grpo"]` → nested dict. Values are TOML (bare words = strings)."""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not p for p in key.split(".")):
            raise ConfigError([ConfigIssue("--set", safe_override(item), "override must look like section.key=value",
                                           "e.g. --set vapo.alpha=0.5")])
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError([ConfigIssue("--set", key, "conflicts with another override", "set it once")])
        node[parts[-1]] = _toml_value(value.strip())
    return out


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word such as grpo or token_mean


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validate(model: type[BaseModel], data: dict, file: str, overrides: dict,
             preset: tuple[str, dict] | None = None, context: dict | None = None) -> Any:
    """Validate `data` with `model`; raise `ConfigError` listing every problem with key, range and fix, each
    named after where the value came from: an override (--set), the preset file (`preset` = its path and
    contents) or `file`."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        where = (lambda loc: _source(file, overrides, loc, preset))
        raise ConfigError([_issue(model, err, where) for err in e.errors()]) from None


def _issue(model: type[BaseModel], err: dict, where) -> ConfigIssue:
    loc = [str(p) for p in err["loc"]]
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        return ConfigIssue(where(problem.key.split(".")), problem.key, problem.message, problem.fix)
    key = ".".join(loc)
    src = where(loc)
    if err["type"] == "extra_forbidden":
        return _unknown_key(model, loc, src)
    if err["type"] == "missing":
        return ConfigIssue(src, key, "required key is missing", f"add {key}")
    items = [i for i, p in enumerate(err["loc"]) if isinstance(p, int)]
    if items:  # an element of a list: `rollout.urls[0]`, checked against the list's field
        loc = [str(p) for p in err["loc"][:items[0]]]
        key = ".".join(loc) + "".join(f"[{p}]" for p in err["loc"][items[0]:] if isinstance(p, int))
        src = where(loc)
    field = _field(model, loc)
    shown = redact_tokens(json.dumps(err.get("input"), default=str))  # a pasted token must not reach the message
    if any(w in loc[-1].lower() for w in ("key", "token", "secret", "header")):
        shown = redact(str(err.get("input")))  # a pasted key must not reach the message
    allowed = _allowed(field, err)
    default = "" if field is None or field.default is None or callable(field.default_factory) \
        else f" (default {json.dumps(field.default, default=str)})"
    shape = expected_shape(err["type"])
    msg = f"value {shown} is invalid" + ("" if "expected" in (err.get("ctx") or {}) else
                                         f": expected {shape}" if shape else f": {err['msg'].lower()}")
    given = err.get("input") if shown == json.dumps(err.get("input"), default=str) else shown
    nested = _model_at(model, loc)
    fix = shape_fix(key, err["type"], given, from_set=src == "--set", allowed=allowed,
                    default=None if field is None or callable(field.default_factory) else field.default,
                    table_keys=list(nested.model_fields) if nested else ())
    return ConfigIssue(src, key, msg + (f"; allowed: {allowed}" if allowed else ""),
                       (fix + default if fix and default and "e.g." not in fix else fix)
                       or f"set {key} to {allowed or 'a valid value'}{default}")


def _source(file: str, overrides: dict, loc: list[str], preset: tuple[str, dict] | None = None) -> str:
    if _holds(overrides, loc):
        return "--set"
    return preset[0] if preset and _holds(preset[1], loc) else file


def _holds(tree: dict, loc: list[str]) -> bool:
    node: Any = tree
    for p in loc:
        if not isinstance(node, dict) or p not in node:
            return False
        node = node[p]
    return True


def _unknown_key(model: type[BaseModel], loc: list[str], src: str) -> ConfigIssue:
    parent = _model_at(model, loc[:-1])
    names = list(parent.model_fields) if parent else []
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    prefix = ".".join(loc[:-1])
    fq = (lambda n: f"{prefix}.{n}" if prefix else n)
    hint = f"did you mean {fq(close[0])}? " if close else ""
    return ConfigIssue(src, ".".join(loc), "unknown key", f"{hint}allowed keys here: {', '.join(names)}")


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    for p in path:
        f = model.model_fields.get(p)
        ann = getattr(f, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _field(model: type[BaseModel], loc: list[str]):
    parent = _model_at(model, loc[:-1])
    return parent.model_fields.get(loc[-1]) if parent and loc else None


def _allowed(field, err: dict) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return str(ctx["expected"])
    if field is None:
        return ""
    lo = hi = None
    for m in field.metadata:
        for attr, sym in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            v = getattr(m, attr, None)
            if v is not None:
                if sym in (">", "≥"):
                    lo = f"{sym} {v}"
                else:
                    hi = f"{sym} {v}"
    return " and ".join(x for x in (lo, hi) if x)
