"""Scrub secrets out of any text before it reaches a result, an exception message, a file or a log record.

Two layers:
- **Known secrets** (the channel key) are replaced by their `redact()` form wherever they show up, in the
  forms a server or a proxy realistically echoes: as is, stripped, URL-encoded, JSON-escaped, base64 (at any
  alignment, as inside a `Basic` auth header), upper- or lower-cased. Partial echoes count too: any run of
  `WINDOW` or more consecutive characters of a key of `MIN_WINDOWED`+ characters is redacted, so a server that
  prints "the first 20 characters of your key" leaks nothing. Shorter secrets are replaced when whole.
- **Credential-shaped text** with no known value: `Bearer …`, well-known prefixes (`sk-…`, `hf_…`, `AIza…`),
  `name: value` / `name=value` pairs whose name says credential (`"api_key": "…"`, `x-api-key: …`, `?key=…`,
  `Authorization: Basic …`, `API key provided: …`) and URL credentials (`scheme://user:pass@host`, or
  `user:pass@host` with a network host: a model name such as `builtin:chain@v9` stays as it is).

`guard_logs` puts the same scrubbing on the records of the HTTP libraries (httpx/httpcore log response
headers at DEBUG, reason phrases at INFO) and of this package, for every key a client was built with.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from pydantic import BaseModel

from vapo_engine.config import Secret, redact
from vapo_engine.config.credentials import (
    bearer_value_spans,
    bounded,
    known_prefix_spans,
    named_value_spans,
    replace_spans,
)
from vapo_engine.config.secrets import redact_tokens, strip_url_credentials

WINDOW = 8
"""Shortest run of a known key's characters that counts as an echo of it."""
MIN_WINDOWED = 16
"""Keys at least this long are matched by windows; shorter ones only when whole."""
STRIDE = WINDOW // 2

_FINDERS = (bearer_value_spans, known_prefix_spans, named_value_spans)
"""Credential-shaped text, in the order it is redacted (each linear in its input: config.credentials)."""
S = TypeVar("S", bound=BaseModel)


def _values(secrets: Iterable[Secret | str | None]) -> tuple[str, ...]:
    out = set()
    for s in secrets:
        value = s.reveal() if isinstance(s, Secret) else s
        if value and len(value) >= 4:
            out.add(value)
            if len(value.strip()) >= 4:
                out.add(value.strip())
    return tuple(sorted(out, key=lambda v: (-len(v), v)))


@lru_cache(maxsize=64)
def _variants(value: str) -> tuple[str, ...]:
    """The encodings of `value` a server or proxy may echo (base64 trimmed to the characters that depend on
    the key alone, whatever precedes it)."""
    forms = {value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}
    raw = value.encode("utf-8", "replace")
    for offset in range(3):
        b64 = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        core = b64[4 if offset else 0:-4]
        forms.update({core, core.replace("+", "-").replace("/", "_")})
    return tuple(f for f in forms if len(f) >= WINDOW)


@lru_cache(maxsize=64)
def _window_table(values: tuple[str, ...]) -> tuple[dict[str, str], frozenset[str]]:
    """Every lower-cased `WINDOW`-gram of every variant of the long secrets → the secret it belongs to, and
    every `STRIDE`-gram of them (the cheap first test, see `_window_starts`)."""
    table: dict[str, str] = {}
    quads: set[str] = set()
    for value in values:
        if len(value) < MIN_WINDOWED:
            continue
        for form in _variants(value):
            low = form.lower()
            for i in range(len(low) - WINDOW + 1):
                table.setdefault(low[i:i + WINDOW], value)
            quads.update(low[i:i + STRIDE] for i in range(len(low) - STRIDE + 1))
    return table, frozenset(quads)


def _lower(text: str) -> str:
    """`text.lower()` with the same length (a few non-ASCII letters lower-case to two characters)."""
    low = text.lower()
    return low if len(low) == len(text) else "".join(c.lower() if len(c.lower()) == 1 else c for c in text)


def _window_starts(low: str, table: dict[str, str], quads: frozenset[str]) -> list[int]:
    """Every i where low[i:i+WINDOW] is in `table`, probing one position in `STRIDE` first: a window starting
    at i contains the `STRIDE`-gram at the next multiple of `STRIDE` (it starts at most STRIDE-1 later and
    ends inside the window), so only windows around such a hit can match."""
    last = len(low) - WINDOW
    hits = [j for j in range(0, len(low) - STRIDE + 1, STRIDE) if low[j:j + STRIDE] in quads]
    return sorted({i for j in hits for i in range(max(0, j - STRIDE + 1), min(j, last) + 1)
                   if low[i:i + WINDOW] in table})


def _mask_windows(text: str, tables: tuple[dict[str, str], frozenset[str]]) -> str:
    table, quads = tables
    if not table or len(text) < WINDOW:
        return text
    spans: list[list] = []
    low = _lower(text)
    for i in _window_starts(low, table, quads):
        if spans and i <= spans[-1][1]:
            spans[-1][1] = i + WINDOW
        else:
            spans.append([i, i + WINDOW, table[low[i:i + WINDOW]]])
    if not spans:
        return text
    out, last = [], 0
    for start, end, value in spans:
        out += [text[last:start], redact(value)]
        last = end
    return "".join(out) + text[last:]


def _mask_known(text: str, values: tuple[str, ...]) -> str:
    text = _mask_windows(text, _window_table(values))
    for value in values:
        if len(value) < MIN_WINDOWED and value in text:
            text = text.replace(value, redact(value))
    return text


def scrub(text: object, secrets: Iterable[Secret | str | None] = ()) -> str:
    """`text` with known secrets (and their echoes) and credential-shaped substrings redacted. Linear in the
    input; text beyond `credentials.MAX_SCAN_CHARS` is dropped (with a marker), never returned unscrubbed."""
    out = bounded("" if text is None else str(text))
    out = _mask_known(out, _values(secrets))
    for find in _FINDERS:
        out = replace_spans(out, find(out), _redact_once)
    return strip_url_credentials(out)


def _redact_once(secret: str) -> str:
    return secret if _already_redacted(secret) else redact(secret)


def _already_redacted(value: str) -> bool:
    return "…" in value or "***" in value


def scrub_obj(obj: Any, secrets: Iterable[Secret | str | None] = ()) -> Any:
    """Parsed JSON (or any nest of dicts, lists and scalars) with every string — keys included — scrubbed."""
    return _scrub_tree(obj, _values(secrets), 0)


def _scrub_tree(obj: Any, values: tuple[str, ...], depth: int) -> Any:
    if isinstance(obj, str):
        return scrub(obj, values)
    if depth > 40:
        return None
    if isinstance(obj, Mapping):
        return {scrub(k, values): _scrub_tree(v, values, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub_tree(v, values, depth + 1) for v in obj]
    return obj


def scrub_model(model: S, secrets: Iterable[Secret | str | None] = ()) -> S:
    """A pydantic result with every string field scrubbed (the last check before it leaves a tool)."""
    return type(model).model_validate(scrub_obj(model.model_dump(mode="json"), secrets))


def truncate(text: str | None, limit: int) -> str:
    """At most `limit` characters; a marker says how much was cut."""
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 30)] + f" …[{len(text) - limit + 30} chars cut]"


SAFE_TEXT_MARGIN = 1024
"""`safe_text` reads this much past `limit`: a key that starts in the part shown is whole in what is scrubbed."""


def safe_text(text: object, limit: int, secrets: Iterable[Secret | str | None] = ()) -> str:
    """Scrubbed, then truncated (scrub first: truncation could cut a key so the patterns miss it). Only the
    first `limit + SAFE_TEXT_MARGIN` characters are read, so a huge text costs no more than a short one."""
    text = "" if text is None else str(text)
    if len(text) <= limit + SAFE_TEXT_MARGIN:
        return truncate(scrub(text, secrets), limit)
    return scrub(text[:limit + SAFE_TEXT_MARGIN], secrets)[:max(0, limit - 30)] + f" …[{len(text) - limit + 30} chars cut]"


# --- log records ------------------------------------------------------------------------------------------

GUARDED_LOGGERS = ("httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
                   "httpcore.proxy", "httpcore.socks", "vapo_engine.providers", "tools.channel", "tools.smoke")
"""Loggers whose records may carry server-controlled text (a filter only sees its own logger's records)."""
_guarded: tuple[str, ...] = ()
_guard_lock = threading.Lock()


class _ScrubFilter(logging.Filter):
    """Rewrites a record's message (and formatted traceback) with every guarded key redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrub_record(record, _guarded)
        return True


def scrub_record(record: logging.LogRecord, secrets: Iterable[Secret | str | None]) -> logging.LogRecord:
    """`record` with its message and formatted traceback scrubbed of `secrets` (in place; returned)."""
    try:
        msg = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is the logging module's business
        return record
    clean = scrub(msg, secrets)
    if clean != msg:
        record.msg, record.args = clean, ()
    if record.exc_info and not record.exc_text:
        record.exc_text = scrub(logging.Formatter().formatException(record.exc_info), secrets)
    return record


_FILTER = _ScrubFilter()


def guard_logs(secret: Secret | str | None) -> None:
    """From now on, redact `secret` from every record of `GUARDED_LOGGERS` (idempotent, thread-safe)."""
    global _guarded
    with _guard_lock:
        _guarded = _values((*_guarded, secret))
        for name in GUARDED_LOGGERS:
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


def public_message(exc: BaseException, secrets: Iterable[Secret | str | None] = ()) -> str:
    """The text of a user error (vapo_engine.errors) as every front-end shows it: scrubbed of the known
    `secrets` and of anything credential-shaped, since a message may quote the caller's input (an override,
    a tag, a header)."""
    return redact_tokens(scrub(str(exc), secrets))
