"""Scrub secrets out of any text before it reaches a result, an exception message or a log record.

Two layers: the exact secrets the caller knows (the channel key) are replaced by their `redact()` form, and
anything shaped like a credential (`Bearer …`, `sk-…`, `hf_…`, `AIza…`, `user:pass@` in proxy URLs) is
redacted too, so a server that echoes the key, or a traceback that holds one, cannot leak it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from vapo_engine.config import Secret, redact

_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)([^\s\"',;}]{6,})"),
    re.compile(r"(?<![A-Za-z0-9])((?:sk|gsk|xai|pk|rk|ak)[-_](?:[A-Za-z0-9]+[-_])*[A-Za-z0-9]{12,})"),
    re.compile(r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,})"),
    re.compile(r"(?<![A-Za-z0-9])(AIza[0-9A-Za-z_\-]{30,})"),
    re.compile(r"(?i)((?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9_\-.]{20,})"),
)
_URL_CREDENTIALS = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)([^/@\s:]+):([^/@\s]+)@")


def _secret_values(secrets: Iterable[Secret | str | None]) -> list[str]:
    out = []
    for s in secrets:
        value = s.reveal() if isinstance(s, Secret) else s
        if value and len(value) >= 4:
            out.append(value)
            if value.strip() != value and len(value.strip()) >= 4:
                out.append(value.strip())
    return sorted(set(out), key=len, reverse=True)


def scrub(text: object, secrets: Iterable[Secret | str | None] = ()) -> str:
    """`text` with known secrets and credential-shaped substrings redacted."""
    out = "" if text is None else str(text)
    for value in _secret_values(secrets):
        out = out.replace(value, redact(value))
    for pat in _PATTERNS:
        out = pat.sub(_replace, out)
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", out)


def _replace(m: re.Match) -> str:
    if m.lastindex == 2:
        secret = m.group(2)
        return m.group(1) + (secret if _already_redacted(secret) else redact(secret))
    secret = m.group(1)
    return secret if _already_redacted(secret) else redact(secret)


def _already_redacted(value: str) -> bool:
    return "…" in value or "***" in value


def truncate(text: str | None, limit: int) -> str:
    """At most `limit` characters; a marker says how much was cut."""
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 30)] + f" …[{len(text) - limit + 30} chars cut]"


def safe_text(text: object, limit: int, secrets: Iterable[Secret | str | None] = ()) -> str:
    """Scrubbed, then truncated (scrub first: truncation could cut a key so the patterns miss it)."""
    return truncate(scrub(text, secrets), limit)
