"""Every use of the MCP SDK's internals, in one place (the SDK's range is pinned in pyproject.toml).

The server is built on the SDK's public surface (`MCPServer`, its decorators, `Extension`, `server.middleware`);
a few things it needs have no public form in mcp 2.3, and each is reached here and nowhere else:

- `lowlevel(mcp)`: the low-level `Server` under an `MCPServer` (`mcp._lowlevel_server`), to serve methods the
  SDK's `MCPServer` does not (`resources/subscribe`, the 2025-11-25 tasks' `tools/list` flag) and to replace a
  handler around the SDK's own (`subscriptions/listen`, `tools/list`);
- `extend_capabilities(mcp, **fields)`: `initialize`'s capabilities with fields the SDK does not declare
  itself (the 2025-11-25 `tasks` capability), by wrapping `Server.get_capabilities`;
- `connection_of(ctx)` / `on_connection_closed(ctx, fn)`: the client connection behind a request
  (`ServerSession._connection`) and its teardown stack, so state kept per client ends with the client;
- `run_stdio(mcp)`: the SDK's stdio transport, except that a line it cannot decode (invalid JSON, a lone
  surrogate such as "\\ud800") is answered — the SDK drops it and the client waits forever.

`check()` verifies that each of these still exists and behaves as assumed, and raises `SDKChanged` naming the
installed version when one does not (tests/test_sdk_adapter.py calls it; so does `build_server`), so an SDK
upgrade fails loudly at start instead of silently losing a bound. Imports no torch.
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

SDK = f"mcp {version('mcp')}"
TESTED = "mcp 2.3"
"""The SDK release this adapter was written against (pyproject.toml pins `mcp>=2.3,<2.4`)."""


class SDKChanged(RuntimeError):
    """An SDK internal this server relies on is gone or changed shape."""


def _changed(what: str) -> SDKChanged:
    return SDKChanged(f"{SDK} (this adapter: {TESTED}) no longer has {what}: server/sdk.py must be updated for it, "
                      "or install the pinned range (pip install 'mcp>=2.3,<2.4')")


def lowlevel(mcp) -> Any:
    """The low-level `Server` of an `MCPServer`."""
    server = getattr(mcp, "_lowlevel_server", None)
    if server is None:
        raise _changed("MCPServer._lowlevel_server")
    return server


def add_request_handler(mcp, method: str, params_type: type, handler: Callable) -> None:
    lowlevel(mcp).add_request_handler(method, params_type, handler)


def wrap_request_handler(mcp, method: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace the handler of `method` by `wrap(the SDK's handler)` (same params type)."""
    entry = lowlevel(mcp).get_request_handler(method)
    if entry is None:
        raise _changed(f"a handler for {method!r}")
    lowlevel(mcp).add_request_handler(method, entry.params_type, wrap(entry.handler))


def has_request_handler(mcp, method: str) -> bool:
    return lowlevel(mcp).get_request_handler(method) is not None


def extend_capabilities(mcp, **fields) -> None:
    """`initialize` declares `fields` (ServerCapabilities fields) besides what the SDK derives."""
    server = lowlevel(mcp)
    derived = server.get_capabilities

    def with_fields(*args, **kwargs):
        return derived(*args, **kwargs).model_copy(update=fields)
    server.get_capabilities = with_fields


def connection_of(ctx) -> object:
    """The client connection a request arrived on (one per stdio client or HTTP session)."""
    return getattr(ctx.session, "_connection", ctx.session)


def on_connection_closed(ctx, fn: Callable[[], None]) -> None:
    """Call `fn()` when the client connection of `ctx` ends (an HTTP session deleted or expired, stdio closed)."""
    stack = getattr(connection_of(ctx), "exit_stack", None)
    if stack is not None:
        stack.callback(fn)


# --- stdio ---------------------------------------------------------------------------------------------------
def undecodable_answer(exc: Exception) -> JSONRPCError:
    """The error response to a line the SDK could not decode (its pydantic error carries the line): invalid
    request with the request's id when the line is JSON with an id (e.g. a lone surrogate in a string), else a
    parse error with id null."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    line = errors[0].get("input") if errors else None
    try:
        data = json.loads(line) if isinstance(line, (str, bytes)) else None
    except ValueError:
        data = None
    rid = data.get("id") if isinstance(data, dict) else None
    if isinstance(rid, (str, int)) and not isinstance(rid, bool):
        return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=INVALID_REQUEST, message=(
            "the request holds a string that is not valid Unicode (a lone surrogate such as \\ud800); send UTF-8 "
            "text")))
    return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message=(
        "parse error: a line is not one JSON-RPC message in UTF-8 JSON; send one JSON object per line")))


class _Answering:
    """The read stream of a transport, with every undecodable item answered on `write` and skipped."""

    def __init__(self, inner, write):
        self._inner, self._write = inner, write

    @property
    def last_context(self):
        return getattr(self._inner, "last_context", None)

    async def receive(self):
        from mcp.shared.message import SessionMessage
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            await self._write.send(SessionMessage(undecodable_answer(item)))

    def __aiter__(self):
        return self

    async def __anext__(self):
        import anyio
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    def close(self) -> None:
        self._inner.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


async def run_stdio(mcp) -> None:
    """Serve `mcp` over stdin/stdout like `MCPServer.run("stdio")`, answering undecodable lines."""
    from mcp.server.stdio import stdio_server
    server = lowlevel(mcp)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(_Answering(read_stream, write_stream), write_stream,
                         server.create_initialization_options())


# --- the check ---------------------------------------------------------------------------------------------------
def check(mcp=None) -> None:
    """Raise `SDKChanged` (naming the installed SDK) when an internal used above is gone or changed shape."""
    from mcp.server.lowlevel.server import Server
    from mcp.server.session import ServerSession
    from mcp.server.stdio import stdio_server
    for name in ("add_request_handler", "get_request_handler", "get_capabilities", "create_initialization_options",
                 "run"):
        if not callable(getattr(Server, name, None)):
            raise _changed(f"Server.{name}")
    if "session" not in inspect.signature(ServerSession.__init__).parameters and \
            "connection" not in inspect.signature(ServerSession.__init__).parameters:
        raise _changed("ServerSession(connection=…)")
    from mcp.server.connection import Connection
    if "exit_stack" not in Connection.__annotations__:
        raise _changed("Connection.exit_stack")
    if set(inspect.signature(stdio_server).parameters) != {"stdin", "stdout"}:
        raise _changed("stdio_server(stdin, stdout)")
    if mcp is not None:
        server = lowlevel(mcp)
        if not isinstance(server.middleware, list) or server.get_request_handler("tools/list") is None:
            raise _changed("Server.middleware / the tools/list handler")
    import mcp_types
    try:
        mcp_types.jsonrpc_message_adapter.validate_json('{"jsonrpc": "2.0", "id": 1, "method": "x\\ud800"}')
    except Exception as e:  # noqa: BLE001 - any error is fine, as long as it carries the line
        if not (hasattr(e, "errors") and isinstance(e.errors()[0].get("input"), (str, bytes))):
            raise _changed("the line in the stdio decoder's error") from None
