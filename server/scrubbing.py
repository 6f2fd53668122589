"""The one choke point for text that leaves the MCP server: every response, every error, every log line.

A caller's own text comes back in many places — an unknown tool's or argument's name, an unknown prompt or
resource URI, a method name the SDK does not serve, a prompt filled in from its arguments, a tool's finding that
quotes an override — and any of it may hold the channel's key (known here only by value) or something
credential-shaped. So, whatever produced it:

- `middleware` (first in the server's middleware chain) scrubs every result and every error message / data
  before the transport writes it (binary blobs aside), turns an exception the SDK would answer with code 0 or a
  bare "Internal server error" into a JSON-RPC error with the spec's code (-32602 for bad params, -32603 with the
  exception's type otherwise), and bounds the size of what it echoes;
- `install_log_scrubbing` wraps the process's log-record factory, so every record of every logger (the SDK's
  "Tool 'x' failed: …", uvicorn's, ours) is scrubbed when it is made, its traceback text too.

The key is the configured channel's (tools.paths.known_secrets: settings.json + the environment, read each
time, ~0.3 ms). Imports no torch.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND
from pydantic import ValidationError

from tools.paths import known_secrets
from vapo_engine.providers.redaction import scrub, scrub_record

log = logging.getLogger("vapo_mcp.server")
MAX_MESSAGE = 4000
"""Characters of an error message sent (the SDK would echo a caller's megabyte-long URI or name in full)."""
THREAD_ABOVE = 256 * 1024
"""Results with more text than this are scrubbed in a worker thread, off the event loop."""
BINARY = frozenset({"blob"})
"""Keys whose values are base64 (a resource's bytes); `data` of image / audio content too."""


def text(value: object, secrets: list | None = None) -> str:
    return scrub(value, known_secrets() if secrets is None else secrets)


def _size(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, str):
        return len(obj)
    if depth > 40:
        return 0
    if isinstance(obj, dict):
        return sum(len(str(k)) + _size(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(_size(v, depth + 1) for v in obj)
    return 0


def _walk(obj: Any, secrets: list, depth: int = 0) -> Any:
    if isinstance(obj, str):
        return scrub(obj, secrets)
    if depth > 40 or not isinstance(obj, (dict, list, tuple)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_walk(v, secrets, depth + 1) for v in obj]
    binary = BINARY | ({"data"} if obj.get("type") in ("image", "audio") else set())
    return {scrub(k, secrets) if isinstance(k, str) else k:
            v if k in binary else _walk(v, secrets, depth + 1) for k, v in obj.items()}


async def result(obj: Any) -> Any:
    """A wire result with every string scrubbed (keys too); large ones off the event loop."""
    secrets = known_secrets()
    if _size(obj) > THREAD_ABOVE:
        return await anyio.to_thread.run_sync(_walk, obj, secrets)
    return _walk(obj, secrets)


def _short(value: object, secrets: list) -> str:
    out = scrub(str(value)[:MAX_MESSAGE + 1024], secrets)
    return out if len(out) <= MAX_MESSAGE else out[:MAX_MESSAGE] + " …"


def _scrubbed_error(e: MCPError, method: str) -> MCPError:
    secrets = known_secrets()
    data = e.error.data
    if e.error.code == METHOD_NOT_FOUND and isinstance(data, str):
        data = _short(data[:200], secrets)
    elif data is not None:
        data = _walk(data, secrets) if _size(data) <= 64 * 1024 else None
    return MCPError(e.error.code, _short(e.error.message, secrets), data=data)


def _params_message(method: str, e: ValidationError) -> str:
    first = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "params"
    return (f"invalid params for {method[:100]}: {where}: {first.get('msg', 'invalid')}; "
            f"{e.error_count()} problem(s) in all — send params of the shape the method takes")


async def middleware(ctx, call_next):
    """Scrub what the request answers, and give every failure the spec's error code (see the module docstring)."""
    method = str(getattr(ctx, "method", "?"))[:200]
    try:
        out = await call_next(ctx)
    except MCPError as e:
        raise _scrubbed_error(e, method) from None
    except ValidationError as e:
        raise MCPError(INVALID_PARAMS, _short(_params_message(method, e), known_secrets())) from None
    except Exception as e:  # a bug: the client gets its type, the log (scrubbed) the traceback
        log.exception("%s failed with %s", method, type(e).__name__)
        raise MCPError(INTERNAL_ERROR, f"internal error in {method} ({type(e).__name__}); the server log says "
                                       "why — report it with that log") from None
    return await result(out)


# --- log records -------------------------------------------------------------------------------------------------
_inside = threading.local()


def install_log_scrubbing() -> None:
    """Scrub every log record of this process when it is made (idempotent)."""
    made = logging.getLogRecordFactory()
    if getattr(made, "scrubs", False):
        return

    def factory(*args, **kwargs):
        record = made(*args, **kwargs)
        if getattr(_inside, "busy", False):  # reading the settings logged something: it is scrubbed by pattern
            return scrub_record(record, [])
        _inside.busy = True
        try:
            return scrub_record(record, known_secrets())
        finally:
            _inside.busy = False
    factory.scrubs = True
    logging.setLogRecordFactory(factory)


