"""MCP tasks: start_training, ablate and evaluate called as tasks return a task at once; the client polls it.

Two wire forms, one store:
  * 2026-07-28, the `io.modelcontextprotocol/tasks` extension (SEP-2663, on the SDK's extension interface, SEP-2133):
    a client that declares the extension in a `tools/call`'s capabilities gets `resultType: "task"` with the task;
    `tasks/get` carries `pollIntervalMs` and, once completed, the result inline; `tasks/cancel` is acknowledged.
  * 2025-11-25, experimental core tasks: a `tools/call` with `params.task` gets `{task}`; the tools list says
    `execution.taskSupport: "optional"` for these tools and initialize declares `capabilities.tasks`; `tasks/get`,
    `tasks/result` (waits for the end), `tasks/cancel` (returns the task), `tasks/list`.
A client that asks for neither gets today's results. A call refused before a run starts (bad config, a doctor
error) answers with its ordinary error result, not a task.

The task id of start_training is the run id, of ablate the ablation id: `tools.run_tasks` answers for them from
the run directories, so a task outlives this process. `tasks/cancel` is the graceful stop (checkpoint first); the
result is the run's final summary. evaluate runs in this process (an asyncio task; its record lives in memory,
see `LocalTasks`). Everything runs under the server's access policy, like the tools. Imports no torch.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolResult,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    PaginatedRequestParams,
    ServerTasksCapability,
    ServerTasksRequestsCapability,
    TasksCallCapability,
    TasksCancelCapability,
    TasksListCapability,
    TasksToolsCapability,
    ToolExecution,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from tools import access
from tools import run_tasks as runs
from tools.eval_gate import EvalGate
from tools.paths import files, known_secrets
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message

from . import arguments as arguments_text
from . import sdk
from .local_tasks import LOCAL_PREFIX, LocalTasks

EXTENSION = "io.modelcontextprotocol/tasks"
RELATED = "io.modelcontextprotocol/related-task"
RUN_TOOLS = ("start_training", "ablate")
TASK_TOOLS = (*RUN_TOOLS, "evaluate")
POLL_MS = 2000
"""The poll interval clients are asked to keep (a training step takes seconds; the run state changes slowly)."""


class _TaskRef(BaseModel):
    task_id: arguments_text.RunId


def _wire(result: Any) -> dict:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(result, BaseModel) \
        else dict(result)


def _legacy(view: runs.TaskView) -> dict:
    return {"taskId": view.task_id, "status": view.status, "statusMessage": view.message,
            "createdAt": view.created_at, "lastUpdatedAt": view.updated_at, "ttl": None, "pollInterval": POLL_MS}


def _modern(view: runs.TaskView) -> dict:
    return {"taskId": view.task_id, "status": view.status, "statusMessage": view.message,
            "createdAt": view.created_at, "lastUpdatedAt": view.updated_at, "ttlMs": None, "pollIntervalMs": POLL_MS}


def _modern_era(ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


class RunTasks(Extension):
    """The tasks of this server: the extension (methods, the tools/call interceptor) and, via `attach`, the
    2025-11-25 form (a middleware, the tools list's taskSupport, initialize's capability)."""

    identifier = EXTENSION

    def __init__(self, gate: EvalGate | None = None):
        self.policy: access.Policy | None = None
        self.gate = gate or EvalGate()
        self.local = LocalTasks(limit=self.gate.capacity)

    # -- the task store: runs (tools.run_tasks) and this process's evaluate tasks ------------------------------
    async def _tools(self, fn, *args):
        """`fn(files, *args)` in a worker thread under the server's policy; a user error becomes invalid params."""
        try:
            with access.applied(self.policy or access.Policy("stdio")):
                return await anyio.to_thread.run_sync(functools.partial(fn, files(), *args))
        except Exception as e:
            if is_user_error(e):
                raise MCPError(INVALID_PARAMS, public_message(e, known_secrets())) from None
            raise

    def _task_id(self, method: str, value: str) -> str:
        try:
            return _TaskRef(task_id=value).task_id
        except ValidationError as e:
            raise MCPError(INVALID_PARAMS, arguments_text.describe_validation(
                method, e, _TaskRef.model_json_schema())) from None

    async def view(self, method: str, task_id: str) -> runs.TaskView:
        task_id = self._task_id(method, task_id)
        if task_id.startswith(LOCAL_PREFIX):
            return self.local.view(task_id)
        return await self._tools(runs.task_of, task_id)

    async def outcome(self, view: runs.TaskView) -> tuple[dict, dict | None]:
        """(the CallToolResult of a finished task as wire JSON, the JSON-RPC error of a failed one or None)."""
        if view.task_id.startswith(LOCAL_PREFIX):
            return self.local.outcome(view.task_id)
        content, failed = await self._tools(runs.outcome, view.task_id)
        result = _wire(CallToolResult(content=[{"type": "text", "text": json.dumps(content)}],
                                      structured_content=content, is_error=failed))
        return result, ({"code": INTERNAL_ERROR, "message": view.message} if failed else None)

    # -- starting a task ---------------------------------------------------------------------------------------
    async def start(self, name: str, call) -> tuple[runs.TaskView | None, dict]:
        """Run the tool `name` as a task: `call()` runs the tool call (returns its CallToolResult, wire or model).
        A run tool is called now (it returns at once); its run/ablation id is the task. evaluate runs in the
        background. (None, the tool's result) when the call was refused before any task existed."""
        if name == "evaluate":
            if not self.local.has_room():  # refused before a task exists, like a call refused before its run
                return None, _wire(CallToolResult(content=[{"type": "text", "text": self.gate.busy_message()}],
                                                  is_error=True))
            return self.local.spawn(lambda: _finish(call)), {}
        result = _wire(await call())
        if result.get("isError") or not isinstance(sc := result.get("structuredContent"), dict):
            return None, result
        task_id = sc["run"]["run_id"] if name == "start_training" else sc["ablation_id"]
        return await self._tools(runs.task_of, task_id), result

    async def intercept_tool_call(self, params, ctx, call_next):
        """2026-07-28: a client that declared the extension gets a task for a task tool."""
        declared = (ctx.session.client_capabilities.extensions or {}) if ctx.session.client_capabilities else {}
        if params.name not in TASK_TOOLS or not _modern_era(ctx) or EXTENSION not in declared:
            return await call_next(ctx)
        view, result = await self.start(params.name, lambda: call_next(ctx))
        return result if view is None else {"resultType": "task", **_modern(view)}

    async def legacy_middleware(self, ctx, call_next):
        """2025-11-25: a task-augmented tools/call (`params.task`) of a task tool gets `{task}`."""
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        if ctx.method != "tools/call" or _modern_era(ctx) or not isinstance(params.get("task"), Mapping):
            return await call_next(ctx)
        if params.get("name") not in TASK_TOOLS:  # the tools list says taskSupport only for these
            raise MCPError(METHOD_NOT_FOUND, f"tool {str(params.get('name'))[:100]!r} does not run as a task: call "
                                             f"it without params.task (tools that do: {', '.join(TASK_TOOLS)})")
        view, result = await self.start(params["name"], lambda: call_next(ctx))
        return result if view is None else {"task": _legacy(view)}

    # -- tasks/* -----------------------------------------------------------------------------------------------
    def _check(self, ctx) -> None:
        if _modern_era(ctx):
            require_client_extension(ctx, EXTENSION)

    async def get(self, ctx, params: GetTaskRequestParams) -> dict:
        self._check(ctx)
        view = await self.view("tasks/get", params.task_id)
        if not _modern_era(ctx):
            return _legacy(view)
        out = _modern(view)
        if view.terminal and view.status != "cancelled":
            result, error = await self.outcome(view)
            out.update({"error": error} if error else {"result": result})
        return out

    async def result(self, ctx, params: GetTaskPayloadRequestParams) -> dict:
        """The finished task's CallToolResult (waits while it works, polling every POLL_MS; an HTTP client that goes
        away ends the wait)."""
        self._check(ctx)
        view = await self.view("tasks/result", params.task_id)
        while not view.terminal:
            await anyio.sleep(POLL_MS / 1000)
            if await _client_gone(ctx):
                raise MCPError(INTERNAL_ERROR, "the client went away while waiting for the task")
            view = await self.view("tasks/result", params.task_id)
        result, error = await self.outcome(view)
        if error and view.task_id.startswith(LOCAL_PREFIX):
            raise MCPError(error["code"], error["message"])
        return {**result, "_meta": {**result.get("_meta", {}), RELATED: {"taskId": view.task_id}}}

    async def cancel(self, ctx, params: CancelTaskRequestParams) -> dict:
        self._check(ctx)
        task_id = self._task_id("tasks/cancel", params.task_id)
        view = self.local.cancel(task_id) if task_id.startswith(LOCAL_PREFIX) \
            else await self._tools(runs.cancel, task_id)
        return {} if _modern_era(ctx) else _legacy(view)

    async def list(self, ctx, params: PaginatedRequestParams) -> dict:
        self._check(ctx)
        views = [*self.local.views(), *await self._tools(runs.recent)]
        return {"tasks": [_legacy(v) for v in views]}

    def methods(self):
        legacy = frozenset(HANDSHAKE_PROTOCOL_VERSIONS)  # the extension has no tasks/result nor tasks/list
        return (MethodBinding("tasks/get", GetTaskRequestParams, self.get),
                MethodBinding("tasks/cancel", CancelTaskRequestParams, self.cancel),
                MethodBinding("tasks/result", GetTaskPayloadRequestParams, self.result, protocol_versions=legacy),
                MethodBinding("tasks/list", PaginatedRequestParams, self.list, protocol_versions=legacy))

    # -- the 2025-11-25 form's declarations --------------------------------------------------------------------
    def attach(self, mcp) -> None:
        """Serve the 2025-11-25 form on `mcp` (built with `extensions=[self]`) and run under its policy."""
        self.policy = mcp.policy
        mcp.middleware.append(self.legacy_middleware)  # the SDK's MCPServer has no 2025-11-25 tasks of its own

        def flagged(list_tools):
            async def listed(ctx, params):
                res = await list_tools(ctx, params)
                optional = ToolExecution(task_support="optional")
                return res.model_copy(update={"tools": [t.model_copy(update={"execution": optional})
                                                        if t.name in TASK_TOOLS else t for t in res.tools]})
            return listed
        sdk.wrap_request_handler(mcp, "tools/list", flagged)
        sdk.extend_capabilities(mcp, tasks=ServerTasksCapability(
            list=TasksListCapability(), cancel=TasksCancelCapability(),
            requests=ServerTasksRequestsCapability(tools=TasksToolsCapability(call=TasksCallCapability()))))


async def _client_gone(ctx) -> bool:
    """Whether the HTTP client of this request has disconnected (never, for a transport without a request)."""
    request = getattr(ctx, "request", None)
    is_disconnected = getattr(request, "is_disconnected", None)
    if is_disconnected is None:
        return False
    try:
        return await is_disconnected()
    except Exception:  # noqa: BLE001 - a request that cannot say is treated as still there
        return False


async def _finish(call) -> dict:
    return _wire(await call())
