"""Secrets that cannot leak by accident: `Secret` prints redacted, `redact` is the one redaction format, and
helpers that make user-typed strings (a base URL, `api.api_key_env`, `--set` overrides, tags, whole config
dumps) safe to print or to write into a run directory.

Format (docs/design.md §6.1): prefix + last 4 + length, e.g. ``sk-…c0de (len 51)``. Short values show less.

"Looks like a secret" (`looks_like_secret`) is a heuristic for values that have no context saying they are a
key. A value counts when it carries a well-known key prefix (`sk-`, `hf_`, `AIza`, `ghp_`, `AKIA`, …), or when
its longest run of letters and digits is a long, varied, token-like string:

| the longest letter/digit run is …                    | examples that count                  |
|-------------------------------------------------------|--------------------------------------|
| ≥ 16 chars with lower-case letters and digits         | 40 hex chars, a random alnum key     |
| ≥ 20 chars of upper-case letters and digits only      | `ABCD1234EFGH5678IJKL9`              |

and in both cases varied: ≥ 8 distinct characters, and the character class (lower / upper / digit) changes at
least once every 8 characters, as it does in random strings and not in words or dates.

Never counted: values under 16 characters, letters-only or digits-only runs, anything with whitespace, a path
or URL (`/`, `\\`; their credentials are handled by `strip_url_credentials`), an already redacted value (`…`),
names made of words (`TAOTOKEN_API_KEY`, `openai_api_key_2`, `experiment20240315`). The price of the heuristic
is that a run-together name such as `DeepSeekR1DistillQwen32B` counts as a token: write it with separators
(`deepseek-r1-distill-qwen-32b`) to keep it readable in run snapshots.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from .credentials import (
    bare_userinfo_spans,
    bounded,
    has_known_prefix,
    replace_spans,
    scan,
    url_userinfo_spans,
)

_TOKEN = re.compile(r"[A-Za-z0-9_.+~-]{16,}={0,2}")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_CLASS_RUN = re.compile(r"[a-z]+|[A-Z]+|[0-9]+")
_SPACE = re.compile(r"\s")
_CREDENTIAL_NAME = re.compile(r"(?i)(^|[-_])(authorization|auth|api[-_]?key|apikey|key|token|secret|password|"
                              r"passwd|cookie|credentials?)$")


MIN_CREDENTIAL_CHARS = 6
"""Shorter header values / URL user names are not masked by value (they would blank ordinary words)."""


def channel_credentials(base_url: str, headers: Mapping[str, str] | None = None) -> list[str]:
    """What a channel carries besides its key that is just as secret, for scrubbing by value: the values of
    credential-named default headers (`X-Api-Key`, `Api-Key`, `X-Auth-Token`, `Cookie`, …) and the `user:password@`
    of its base URL (the password; the user too when it is the only credential or looks like a key)."""
    out = [v.strip() for k, v in (headers or {}).items()
           if _CREDENTIAL_NAME.search(str(k)) and isinstance(v, str) and len(v.strip()) >= MIN_CREDENTIAL_CHARS]
    try:
        parts = urlsplit(str(base_url).strip().strip("'\"").strip())
        user, password = parts.username, parts.password
    except ValueError:
        return out
    for value, secret in ((password, True), (user, password is None or looks_like_secret(user or ""))):
        if value and secret and len(value) >= MIN_CREDENTIAL_CHARS:
            out += [value, unquote(value)] if unquote(value) != value else [value]
    return out


def redact(value: str | None) -> str:
    """Redacted form of a secret: first 3 and last 4 characters plus the length (less when short)."""
    if not value:
        return "<empty>"
    n = len(value)
    if n < 8:
        return f"…(len {n})"
    if n < 16:
        return f"…{value[-2:]} (len {n})"
    return f"{value[:3]}…{value[-4:]} (len {n})"


def redact_identifier(value: str) -> str:
    """`redact` spelled as an identifier (prefix, last 4, length), for fields validated as variable names:
    a snapshot keeps validating when `api.api_key_env` held a pasted key."""
    return f"{value[:3]}_REDACTED_{value[-4:]}_LEN{len(value)}" if len(value) >= 16 else "REDACTED"


class Secret:
    """A string whose str/repr/format are redacted; call `reveal()` only where the raw value is sent."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    @property
    def redacted(self) -> str:
        return redact(self._value)

    def __repr__(self) -> str:
        return f"Secret({self.redacted})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __len__(self) -> int:
        return len(self._value)


def looks_like_secret(value: object) -> bool:
    """True when a value with no context looks like a key or token (the table in the module docstring)."""
    if not isinstance(value, str):
        return False
    v = value.strip().strip("\"'`")
    if len(v) < 16 or "…" in v or "/" in v or "\\" in v or _SPACE.search(v):
        return False
    if has_known_prefix(v):
        return True
    run = max(_ALNUM_RUN.findall(v), key=len, default="")
    if len(run) < 16 or len(set(run)) < 8 or _class_changes(run) < max(2, len(run) // 8):
        return False
    digit, lower, upper = (bool(re.search(chars, run)) for chars in ("[0-9]", "[a-z]", "[A-Z]"))
    if digit and lower:
        return True
    return digit and upper and len(run) >= 20


def _class_changes(run: str) -> int:
    """How often the character class (lower, upper, digit) changes along `run` (letters and digits only):
    random tokens change class every one or two characters, words and dates rarely."""
    return len(_CLASS_RUN.findall(run)) - 1


def strip_url_credentials(text: str) -> str:
    """`https://user:pass@host/…` → `https://user:***@host/…`; a user part that looks like a key (or a URL
    with a token as its only credential) becomes `***` too. Linear in `text` (vapo_engine.config.credentials)."""
    text = replace_spans(text, url_userinfo_spans(text), _hide_userinfo)
    return replace_spans(text, bare_userinfo_spans(text), _hide_userinfo)


def _hide_userinfo(userinfo: str) -> str:
    user, sep, _password = userinfo.partition(":")
    if not sep:
        return "***"
    return f"{'***' if looks_like_secret(user) or has_known_prefix(user) else user}:***"


def redact_tokens(text: object) -> str:
    """`text` with URL credentials stripped and every token that `looks_like_secret` redacted (for free text
    that has no known key to compare with: tags, override values, pasted error bodies). Text beyond
    `credentials.MAX_SCAN_CHARS` is dropped."""
    out = strip_url_credentials(bounded("" if text is None else str(text)))
    return replace_spans(out, [m.span() for m in scan(_TOKEN, out, reach=18) if looks_like_secret(m.group(0))],
                         redact)


def safe_env_name(name: str) -> str:
    """`api.api_key_env` fit to show: the name itself, or its redacted form when a key was pasted there."""
    return redact(name) if looks_like_secret(name) else name


def safe_override(item: str) -> str:
    """One `--set section.key=value` with a secret-looking value (or URL credentials) redacted."""
    key, sep, value = str(item).partition("=")
    return f"{redact_tokens(key)}{sep}{redact_tokens(value)}" if sep else redact_tokens(key)


def safe_overrides(items: Iterable[str]) -> list[str]:
    return [safe_override(i) for i in items]


def safe_tags(tags: Iterable[str]) -> list[str]:
    """Tags with secret-looking parts redacted (they are stored in run.json and the run registry)."""
    return [redact_tokens(t) for t in tags]


def _strip_urls(obj: Any) -> Any:
    if isinstance(obj, str):
        return strip_url_credentials(obj)
    if isinstance(obj, Mapping):
        return {k: _strip_urls(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strip_urls(v) for v in obj]
    return obj


def _env_name_safe(section: Any) -> None:
    if isinstance(section, dict) and looks_like_secret(section.get("api_key_env")):
        section["api_key_env"] = redact_identifier(section["api_key_env"])


def safe_config_dump(dump: Mapping) -> dict:
    """config.toml as data, fit to print or to snapshot: URL credentials stripped everywhere, a key pasted into
    `api.api_key_env` redacted (as an identifier, so the snapshot still validates) and a secret-looking
    `model.name` redacted. Other strings stay as they are: the worker reads them (paths, task names, the
    rendezvous) and their validation keeps a pasted key out."""
    out = _strip_urls(dump)
    _env_name_safe(out.get("api"))
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("name"), str):
        model["name"] = redact_tokens(model["name"])
    builtin = (dump.get("model") or {}).get("builtin")
    if isinstance(model, dict) and _is_builtin_model(builtin):  # `builtin:chain@v1` is a name, not `user:pw@host`
        model["builtin"] = builtin
    return out


def _is_builtin_model(name: object) -> bool:
    """Whether `name` is one of the built-in models' names (a fixed list, so it cannot hold a key)."""
    from vapo_engine.builtin_model.recipes import RECIPES  # torch-free
    return isinstance(name, str) and name in RECIPES


def safe_settings_dump(dump: Mapping) -> dict:
    """settings.json as data, fit to print or to snapshot: URL credentials stripped, a key pasted into
    `api.api_key_env` redacted, credential-named or secret-looking `default_headers` values redacted, and
    model ids, the provider name and tags with secret-looking parts redacted."""
    out = _strip_urls(dump)
    api = out.get("api")
    _env_name_safe(api)
    if isinstance(api, dict) and isinstance(api.get("default_headers"), dict):
        api["default_headers"] = {k: redact(str(v)) if _CREDENTIAL_NAME.search(str(k)) else redact_tokens(v)
                                  for k, v in api["default_headers"].items()}
    models = out.get("models")
    if isinstance(models, dict):
        out["models"] = {k: redact_tokens(v) if isinstance(v, str) else v for k, v in models.items()}
    if isinstance(out.get("provider"), str):
        out["provider"] = redact_tokens(out["provider"])
    exp = out.get("experiment")
    if isinstance(exp, dict) and isinstance(exp.get("tags"), list):
        exp["tags"] = safe_tags(exp["tags"])
    return out


def safe_channel_view(public: Mapping | None) -> dict | None:
    """A channel's public view (`Channel.public()` or a dict of the same shape) with the key redacted, URL
    credentials stripped and a key pasted into `api_key_env` redacted, whoever built it."""
    if public is None:
        return None
    out = _strip_urls(public)
    key = out.get("key") or ""
    if isinstance(key, str) and key and "…" not in key and not key.startswith("<"):
        out["key"] = redact(key)
    if isinstance(out.get("api_key_env"), str):
        out["api_key_env"] = safe_env_name(out["api_key_env"])
    return out
