"""Tasks that live in this server process: a tool call (evaluate) run as an asyncio task on the server's event loop,
with its record in memory. Unlike run tasks (tools.run_tasks: the run id is the task id, answered from the run
directory), such a task is gone when the server exits; the newest `KEEP` records are kept.

At most `limit` of them work at once (the server's evaluation bound, tools.eval_gate): one more is refused before
it starts (`has_room`). `cancel` cancels the task's anyio cancel scope — level-triggered, so every await on the
way out is cancelled too and a worker process is killed, not waited for — and the record then holds nothing but
its status. Imports no torch."""
from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from tools.run_tasks import TaskView, iso

LOCAL_PREFIX = "task-"
KEEP = 100


@dataclass
class _Record:
    task_id: str
    created: float
    updated: float
    status: str = "working"
    message: str = "working in this server process"
    result: dict | None = None
    error: dict | None = None
    job: asyncio.Task | None = field(default=None, repr=False)
    scope: anyio.CancelScope | None = field(default=None, repr=False)

    def view(self) -> TaskView:
        return TaskView(task_id=self.task_id, status=self.status, message=self.message,
                        created_at=iso(self.created), updated_at=iso(self.updated))


class LocalTasks:
    def __init__(self, limit: int = KEEP):
        self._tasks: dict[str, _Record] = {}
        self.limit = limit

    def working(self) -> int:
        return sum(r.status == "working" for r in self._tasks.values())

    def has_room(self) -> bool:
        return self.working() < self.limit

    def spawn(self, work) -> TaskView:
        """Start `work()` (a coroutine function returning a CallToolResult as wire JSON) as a task."""
        now = time.time()
        rec = _Record(LOCAL_PREFIX + secrets.token_hex(8), now, now)
        self._tasks[rec.task_id] = rec
        rec.job = asyncio.get_running_loop().create_task(self._run(rec, work))
        while len(self._tasks) > KEEP:  # forget the oldest finished one (a working one is kept)
            done = next((k for k, r in self._tasks.items() if r.status != "working"), None)
            if done is None:
                break
            del self._tasks[done]
        return rec.view()

    async def _run(self, rec: _Record, work) -> None:
        try:
            with anyio.CancelScope() as rec.scope:
                result = await work()
            if rec.scope.cancelled_caught or rec.status == "cancelled":
                raise asyncio.CancelledError
            rec.result, rec.status = result, "completed"
            rec.message = "finished with an error result" if result.get("isError") else "finished"
        except asyncio.CancelledError:
            rec.status, rec.message = "cancelled", "cancelled by tasks/cancel"
        except MCPError as e:
            rec.status, rec.message, rec.error = "failed", e.error.message, {"code": e.error.code,
                                                                             "message": e.error.message}
        except Exception as e:  # noqa: BLE001 - a crash of the tool is the task's failure, not the server's
            rec.status, rec.message = "failed", f"internal error: {type(e).__name__}"
            rec.error = {"code": INTERNAL_ERROR, "message": rec.message}
        finally:
            rec.job = rec.scope = None  # nothing of the work stays referenced
        rec.updated = time.time()

    def _get(self, task_id: str) -> _Record:
        rec = self._tasks.get(task_id)
        if rec is None:
            raise MCPError(INVALID_PARAMS, f"unknown task id '{task_id}': a task of this server process (evaluate) "
                                           "is forgotten when the server restarts; call the tool again")
        return rec

    def view(self, task_id: str) -> TaskView:
        return self._get(task_id).view()

    def views(self) -> list[TaskView]:
        return [r.view() for r in reversed(self._tasks.values())]

    def outcome(self, task_id: str) -> tuple[dict, dict | None]:
        rec = self._get(task_id)
        return rec.result or {"content": [], "isError": rec.status != "completed"}, rec.error

    def cancel(self, task_id: str) -> TaskView:
        rec = self._get(task_id)
        if rec.status != "working":
            raise MCPError(INVALID_PARAMS, f"task {task_id} is already {rec.status}: nothing to cancel")
        if rec.scope is not None:
            rec.scope.cancel()
        elif rec.job is not None:  # not started yet
            rec.job.cancel()
        rec.status, rec.message, rec.updated = "cancelled", "cancelled by tasks/cancel", time.time()
        return rec.view()
