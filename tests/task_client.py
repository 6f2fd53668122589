"""MCP client side of tasks for tests: the 2026-07-28 `io.modelcontextprotocol/tasks` extension as a client
extension (a claim on `resultType: "task"`), and the 2025-11-25 form's requests. The installed SDK (mcp 2.3) has the
task types but no client task support of its own, and its session checks a 2025-11-25 `tools/call` result against
CallToolResult; so the task-augmented `tools/call` of that form goes through the session's own stamp and dispatcher
unchecked (what `send_request` does, without the result check)."""
from __future__ import annotations

from typing import Any, Literal

from mcp.client import ClientExtension, ResultClaim
from mcp_types import (
    CancelTaskRequest,
    CancelTaskRequestParams,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    Result,
)
from pydantic import TypeAdapter

EXTENSION = "io.modelcontextprotocol/tasks"
ANY = TypeAdapter(dict[str, Any])


class TaskHandle(Result):
    """A 2026-07-28 CreateTaskResult."""
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class Tasks(ClientExtension):
    """Declares the extension and takes a task result as a `TaskHandle` (call_tool(..., allow_claimed=True))."""
    identifier = EXTENSION

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self._unused)]

    async def _unused(self, handle, ctx):  # the tests drive tasks/get themselves
        raise AssertionError("call c.session.call_tool(..., allow_claimed=True)")


async def get(session, task_id: str) -> dict:
    return await session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), ANY)


async def cancel(session, task_id: str) -> dict:
    return await session.send_request(CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id)), ANY)


async def result(session, task_id: str) -> dict:
    return await session.send_request(
        GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id)), ANY, 300)


async def legacy_call(session, name: str, arguments: dict, ttl: int = 600_000) -> dict:
    """A 2025-11-25 task-augmented tools/call; the raw result (`{task}` or a CallToolResult)."""
    data: dict = {"method": "tools/call", "params": {"name": name, "arguments": arguments, "task": {"ttl": ttl}}}
    opts: dict = {}
    session._stamp(data, opts)
    return await session._dispatcher.send_raw_request("tools/call", data["params"], opts)
