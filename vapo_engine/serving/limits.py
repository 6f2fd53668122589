"""How much of `serve-model` one client or a crowd can hold (pure ASGI middleware; torch-free).

- `InFlightLimit`: at most `max_concurrent` HTTP requests in progress (a streamed answer counts until its last
  event); one more is answered 503 at once with an OpenAI error that says so and `Retry-After: 1` (the channel's
  client retries 503). `GET /health` is never counted nor refused, so monitoring sees a busy server as up.
- `BODY_TIMEOUT_S`: the whole request body must arrive within this many seconds of the request head
  (`read_body`, used by every route that reads one); a slower one gets 408 and the connection is closed. The
  head itself is bounded by header_timeout.py (uvicorn), the body's size by the app's `MAX_BODY`.
- `BodyTimeout`: the same rule as middleware, for an app that reads its bodies itself (the MCP server's HTTP
  mode, where the MCP SDK reads them): the body is read here with `read_body`, a slow one gets 408 and the
  connection is closed, and the app gets the whole body in one message.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from .security import error_body

MAX_CONCURRENT = 64
"""Default of `--max-concurrent`: requests in progress at once."""
BODY_TIMEOUT_S = 30.0
"""Default of `--body-timeout`: seconds a client has to send its whole request body."""


class InFlightLimit:
    """ASGI middleware: 503 for a request beyond `max_concurrent` in progress (see the module docstring)."""

    def __init__(self, app, max_concurrent: int = MAX_CONCURRENT, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.max, self.open_paths = app, max(1, int(max_concurrent)), open_paths
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.open_paths:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.max:
            return await _busy(send, self.max)
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _busy(send, limit: int) -> None:
    body = error_body(f"the server is busy: {limit} requests are in progress (its --max-concurrent); retry in a "
                      "moment, send fewer requests at once, or restart serve-model with a larger --max-concurrent",
                      "server_busy", "server_error")
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": body})


async def read_body(request, limit: int, too_big: Exception, slow: Exception, timeout_s: float) -> bytes:
    """The request body: `too_big` beyond `limit` bytes (declared or sent), `slow` when it has not all arrived
    `timeout_s` seconds after the call."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big

    async def collect() -> bytes:
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_big
        return bytes(body)
    try:
        return await asyncio.wait_for(collect(), timeout_s)
    except TimeoutError:
        raise slow from None


class _Slow(Exception):
    pass


class _TooBig(Exception):
    pass


def _plain_error(message: str, code: str) -> bytes:
    return json.dumps({"error": message, "code": code}).encode()


class BodyTimeout:
    """ASGI middleware: each HTTP request's whole body must arrive within `timeout_s` seconds of its head and be
    at most `limit` bytes, else 408 (and the connection is closed: the rest of the body is never read) or 413.
    The app then gets the body in one `http.request` message; later `receive()` calls (a client that goes away
    during a streamed answer) reach the server as before. `error(message, code)` makes the JSON error body;
    `flag` names the option that sets the timeout, for the message. Put it inside any bearer-token check, so a
    client without the token is refused on its headers before its body is read."""

    def __init__(self, app, timeout_s: float = BODY_TIMEOUT_S, *, limit: int, flag: str = "--body-timeout",
                 error: Callable[[str, str], bytes] = _plain_error):
        self.app, self.timeout_s, self.limit, self.flag, self.error = app, float(timeout_s), int(limit), flag, error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.requests import ClientDisconnect, Request
        try:
            body = await read_body(Request(scope, receive), self.limit, _TooBig(), _Slow(), self.timeout_s)
        except ClientDisconnect:
            return None  # nobody is left to answer
        except _Slow:
            return await self._refuse(send, 408, "request_timeout", (
                f"the request body did not arrive within {self.timeout_s:g} s of the request head; send it at "
                f"once (the connection is closed; the server's {self.flag} sets this limit)"))
        except _TooBig:
            return await self._refuse(send, 413, "request_too_large", (
                f"the request body is larger than {self.limit // (1024 * 1024)} MiB; send a smaller request"))
        first = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return first.pop() if first else await receive()
        return await self.app(scope, replay, send)

    async def _refuse(self, send, status: int, code: str, message: str) -> None:
        body = self.error(message, code)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
