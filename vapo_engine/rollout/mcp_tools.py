"""The trainer as an MCP client: the tools of the servers in `[rollout.tools]`, callable from the sampling code.

`McpTools(cfg).start()` starts every server (a stdio command: its own process; a streamable-HTTP URL: a session),
lists its tools and keeps the sessions open for the run, on an asyncio loop in a background thread;
`call(name, arguments)` (or `call_many`, the calls of one turn of a batch at once, so a hanging server costs a
turn one timeout, not one per episode) is synchronous and always returns a `ToolResult` — the tool's text, or an error text
for the policy to read: an unknown tool, bad arguments, a tool error, no answer within `call_timeout_s`, a
server that crashed, a result over `max_result_chars` (cut, with a note). None of these fails the run. After a
timeout or an error of the protocol the server must answer a tools/list request within a few seconds (a
liveness probe; the protocol's ping is gone since 2026-07-28), else it is restarted on the next call (at most `max_restarts` times a run; then its calls answer "unavailable").

A server that cannot start (not on PATH, exits, does not list its tools within `start_timeout_s`) refuses the run
at start: `ToolServerError`, one line naming the server, the reason and the fix. `specs()` gives the tools as
chat-template function schemas. This module is the only one outside `server/` that imports `mcp` (the worker
side: imported when a run has tool servers). Counters for the metrics: `restarts`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from vapo_engine.config.tools_model import ToolsConfig, ToolServerConfig
from vapo_engine.errors import UserError

PROBE_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 10.0


class ToolServerError(UserError):
    """A tool server of [rollout.tools] could not start; the message names it, the reason and the fix."""


@dataclass(frozen=True)
class ToolResult:
    """What the policy sees of one call: `text`, and whether it is the tool's complete answer (`ok`)."""

    text: str
    ok: bool


@dataclass
class _Server:
    cfg: ToolServerConfig
    index: int
    client: Any = None
    task: asyncio.Task | None = None
    stop: asyncio.Event | None = None
    tools: list = field(default_factory=list)
    restarts: int = 0
    down: str | None = None
    lock: asyncio.Lock | None = None
    """Held while the session is (re)started or dropped: concurrent calls agree on one restart."""


class McpTools:
    """The tools of `cfg.servers` (see the module docstring)."""

    def __init__(self, cfg: ToolsConfig, log=print):
        self.cfg, self.log = cfg, log
        self.servers = [_Server(s, i) for i, s in enumerate(cfg.servers)]
        self.owner: dict[str, _Server] = {}
        self.restarts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-tools", daemon=True)
        self._thread.start()

    # --- life cycle (caller's thread) -----------------------------------------------------------------------
    def start(self) -> McpTools:
        """Start every server and list its tools; ToolServerError (after closing what started) if one cannot."""
        try:
            for srv in self.servers:
                self._run(self._open(srv), self.cfg.start_timeout_s + CLOSE_TIMEOUT_S)
                for tool in srv.tools:
                    self.owner.setdefault(tool.name, srv)
        except BaseException:
            self.close()
            raise
        return self

    def specs(self) -> list[dict]:
        """Every tool as a chat-template function schema: {"type": "function", "function": {name, description,
        parameters}}, in server order."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                  "parameters": t.input_schema or {"type": "object"}}}
                for name, srv in self.owner.items() for t in srv.tools if t.name == name]

    def call(self, name: str, arguments: dict) -> ToolResult:
        """The result of tool `name` (never raises)."""
        return self.call_many([(name, arguments)])[0]

    def call_many(self, calls: list[tuple[str, dict]]) -> list[ToolResult]:
        """The results of (name, arguments) calls, run concurrently (never raises)."""
        async def all_of():
            return await asyncio.gather(*(self._dispatch(name, args) for name, args in calls))
        try:
            return self._run(all_of(), self.cfg.call_timeout_s + PROBE_TIMEOUT_S + self.cfg.start_timeout_s
                             + 2 * CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return [ToolResult(f"error: {name} did not answer within {self.cfg.call_timeout_s:g} s", False)
                    for name, _ in calls]

    def close(self) -> None:
        """Stop every server and the loop (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._close_all(), 2 * CLOSE_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - closing is best effort; the processes die with ours anyway
            self.log(f"tool servers: closing took too long or failed ({_reason(e)})")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    # --- on the loop ----------------------------------------------------------------------------------------
    async def _open(self, srv: _Server) -> None:
        """Start `srv` and list its tools, or raise ToolServerError."""
        ready: asyncio.Future = self._loop.create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # a late failure is not "unretrieved"
        srv.stop = asyncio.Event()
        srv.task = asyncio.ensure_future(self._hold(srv, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.cfg.start_timeout_s)
        except asyncio.TimeoutError:
            await self._drop(srv)
            raise self._start_error(srv, f"it did not list its tools within {self.cfg.start_timeout_s:g} s") \
                from None
        except Exception as e:  # noqa: BLE001 - any start failure is one clear line
            await self._drop(srv)
            raise self._start_error(srv, _reason(e)) from None

    async def _hold(self, srv: _Server, ready: asyncio.Future) -> None:
        """Keep `srv`'s session open until its stop event; report the start through `ready`."""
        from mcp import Client
        try:
            async with Client(_target(srv.cfg)) as client:
                tools = await _list_tools(client)
                srv.client, srv.tools = client, tools
                ready.set_result(None)
                await srv.stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported through `ready` (start) or by the next call
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(type(e).__name__))
        finally:
            srv.client = None

    async def _dispatch(self, name: str, arguments) -> ToolResult:
        srv = self.owner.get(name)
        if srv is None:
            return ToolResult(f"error: no tool named {str(name)[:60]!r}; tools: {', '.join(self.owner) or 'none'}",
                              False)
        return await self._call(srv, name, arguments if isinstance(arguments, dict) else {})

    async def _session(self, srv: _Server):
        """`srv`'s client, restarted first when it is down (one restart for all concurrent callers)."""
        srv.lock = srv.lock or asyncio.Lock()
        async with srv.lock:
            if srv.client is None:
                await self._restart(srv)
            return srv.client

    async def _call(self, srv: _Server, name: str, arguments: dict) -> ToolResult:
        client = await self._session(srv)
        if client is None:
            return ToolResult(f"error: tool server {srv.cfg.name} is unavailable ({srv.down})", False)
        from mcp.shared.exceptions import MCPError
        try:
            res = await asyncio.wait_for(client.call_tool(name, arguments), self.cfg.call_timeout_s)
        except asyncio.TimeoutError:
            await self._check_alive(srv, client)
            return ToolResult(f"error: {name} did not answer within {self.cfg.call_timeout_s:g} s", False)
        except MCPError as e:  # a JSON-RPC error answer, or the SDK's "connection closed": check the server
            await self._check_alive(srv, client)
            return self._cut(f"error: {e}", ok=False)
        except Exception as e:  # noqa: BLE001 - a broken transport: the call fails, the server is checked
            await self._check_alive(srv, client)
            return ToolResult(f"error: tool server {srv.cfg.name} failed ({_reason(e)})", False)
        text = _text_of(res)
        return self._cut(f"error: {text}" if res.is_error else text, ok=not res.is_error)

    def _cut(self, text: str, ok: bool) -> ToolResult:
        cap = self.cfg.max_result_chars
        if len(text) <= cap:
            return ToolResult(text, ok)
        return ToolResult(text[:cap] + f" [cut: {len(text) - cap} more characters]", False)

    async def _check_alive(self, srv: _Server, client) -> None:
        """After a timeout or a failure of `client`'s call: a server that does not list its tools within
        PROBE_TIMEOUT_S is stopped (and restarted on the next call) — unless another call already did."""
        async with srv.lock:
            if srv.client is not client:
                return
            try:
                await asyncio.wait_for(client.list_tools(cache_mode="bypass"), PROBE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - no answer, a closed transport: either way it is gone
                self.log(f"tool server {srv.cfg.name}: no answer to a liveness probe; it is restarted on the next "
                         "call")
                await self._drop(srv)

    async def _restart(self, srv: _Server) -> bool:
        if srv.down is not None:
            return False
        if srv.restarts >= self.cfg.max_restarts:
            srv.down = f"restarted {srv.restarts} times (rollout.tools.max_restarts)"
            self.log(f"tool server {srv.cfg.name}: {srv.down}; its calls answer 'unavailable' from now on")
            return False
        srv.restarts += 1
        self.restarts += 1
        try:
            await self._open(srv)
            return True
        except ToolServerError as e:
            self.log(f"{e} (restart {srv.restarts})")
            return False

    async def _drop(self, srv: _Server) -> None:
        """Stop `srv`'s session (and its process): by its stop event once it is up, by cancelling it before."""
        if srv.stop is not None:
            srv.stop.set()
        if srv.task is not None and srv.client is None:
            srv.task.cancel()
        if srv.task is not None:
            try:
                await asyncio.wait_for(srv.task, CLOSE_TIMEOUT_S)
            except BaseException:  # noqa: BLE001 - a session that will not close is left to die with the loop
                srv.task.cancel()
        srv.client, srv.task = None, None

    async def _close_all(self) -> None:
        for srv in self.servers:
            await self._drop(srv)

    def _start_error(self, srv: _Server, reason: str) -> ToolServerError:
        fix = ("check the command (run it by hand: it must speak MCP on stdin/stdout)" if srv.cfg.command
               else "check that the server listens at that URL")
        return ToolServerError(f"rollout.tools.servers[{srv.index}] ({srv.cfg.name}): cannot start "
                               f"{srv.cfg.where()!r}: {reason}. Fix: {fix}, or remove it from [rollout.tools]")


async def _list_tools(client) -> list:
    out, cursor = [], None
    for _ in range(20):  # a server that pages forever does not hang the start
        page = await client.list_tools(cursor=cursor)
        out += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return out


def _target(cfg: ToolServerConfig):
    """What mcp.Client connects to: the URL, or stdio parameters of the command ("vapo-mcp" = this install's)."""
    if cfg.url:
        return cfg.url
    from mcp.client.stdio import StdioServerParameters
    program = cfg.program()
    if program is None:
        raise FileNotFoundError(f"{cfg.command[0]!r} is not an executable file and not on PATH")
    return StdioServerParameters(command=program, args=list(cfg.command[1:]))


def _text_of(res) -> str:
    """A call result as text: its text parts joined; other parts named; structured content as JSON if no text."""
    parts = []
    for c in res.content or []:
        parts.append(c.text if getattr(c, "type", "") == "text" else f"[{getattr(c, 'type', 'content')}]")
    if not any(p.strip() for p in parts) and res.structured_content is not None:
        parts = [json.dumps(res.structured_content, ensure_ascii=False, default=str)]
    return "\n".join(parts)


def _reason(e: BaseException) -> str:
    """One line about a failure (the deepest cause of an exception group)."""
    while getattr(e, "exceptions", None):  # an exception group (anyio task groups): its first failure
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__
