"""MCP tasks (docs/mcp.md "Tasks"), through the MCP Python client: over stdio with the 2026-07-28
`io.modelcontextprotocol/tasks` extension and over streamable HTTP with the 2025-11-25 form, each on real tiny runs
of the built-in model — a task-augmented start_training returns a task, tasks/get shows its progress rising,
tasks/cancel stops it after a checkpoint, a second task runs to completion and returns the run's summary, a plain
tools/call still works, and a new server process answers for the tasks of the previous one (in both forms, on
either transport). In memory (no
training): unknown and outside task ids, a client that declares no task support, ablate and evaluate as tasks."""
from __future__ import annotations

import re
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.engine_helpers import FAST
from tests.fake_openai import CANARY, FakeOpenAI, closed_port
from tests.mcp_helpers import HTTP_TOKEN, serve_http, slot_held, text
from tests.task_client import Tasks, cancel, get, legacy_call, result

pytestmark = pytest.mark.anyio
STEP = re.compile(r"step (\d+)/(\d+)")
TERMINAL = ("completed", "failed", "cancelled")


def _overrides(model_dir, *extra) -> list[str]:
    return [*FAST, f'model.local_path="{model_dir}"', *extra]


def _long(model_dir) -> dict:
    """A run that would take long: checkpoints only far ahead, so the one found after a cancel is the stop's."""
    return {"preset": "cpu-demo", "overrides": _overrides(model_dir, "training.total_steps=400",
                                                          "eval.save_interval=1000", "eval.eval_interval=2")}


async def _rising(session, task_id: str, timeout: float = 300) -> list[dict]:
    """Poll tasks/get until the task has shown two different steps and a held-out accuracy; the polls."""
    polls, end = [], time.time() + timeout
    while time.time() < end:
        polls.append(t := await get(session, task_id))
        assert t["status"] == "working", t
        steps = sorted({int(m.group(1)) for p in polls if (m := STEP.search(p["statusMessage"]))})
        if len(steps) >= 2 and steps[-1] > 0 and any("held-out accuracy" in p["statusMessage"] for p in polls):
            return polls
        await anyio.sleep(0.5)
    raise AssertionError(f"no progress: {polls[-1]}")


async def _until(session, task_id: str, status: str, timeout: float = 300) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        t = await get(session, task_id)
        if t["status"] in TERMINAL:
            assert t["status"] == status, t
            return t
        await anyio.sleep(0.5)
    raise AssertionError(f"task {task_id} did not end: {t}")


def _checkpoint_after_cancel(ws: Path, run_id: str, last_step: int) -> None:
    done = [p for p in (ws / "logs").rglob(f"{run_id}/checkpoints/step-*") if (p / "DONE").exists()]
    assert done, f"no finished checkpoint of {run_id}"
    assert max(int(p.name.split("-")[1]) for p in done) >= last_step


async def _refused(session, task_id: str) -> str:
    with pytest.raises(MCPError) as e:
        await get(session, task_id)
    return e.value.error.message


async def test_tasks_over_stdio_2026_extension_survive_a_restart(proj, model_dir):
    from tests.test_server import _stdio
    async with Client(_stdio(proj), extensions=[Tasks()]) as c:
        assert c.session.protocol_version == "2026-07-28"
        assert "io.modelcontextprotocol/tasks" in c.server_capabilities.extensions
        handle = await c.session.call_tool("start_training", _long(model_dir), allow_claimed=True)
        assert handle.result_type == "task" and handle.status == "working" and handle.poll_interval_ms == 2000
        stopped = handle.task_id
        polls = await _rising(c.session, stopped)
        assert all(p["pollIntervalMs"] == 2000 and p["resultType"] == "complete" for p in polls)
        last = int(STEP.search(polls[-1]["statusMessage"]).group(1))
        assert (await cancel(c.session, stopped))["resultType"] == "complete"
        t = await _until(c.session, stopped, "cancelled", timeout=180)
        assert "result" not in t
        _checkpoint_after_cancel(proj, stopped, last)

        handle = await c.session.call_tool("start_training", {"preset": "cpu-demo",
                                                              "overrides": _overrides(model_dir)}, allow_claimed=True)
        finished = handle.task_id
        t = await _until(c.session, finished, "completed")
        res = t["result"]
        assert not res["isError"] and res["structuredContent"]["run"]["state"] == "succeeded"
        assert res["structuredContent"]["summary"]["steps"] == 3 and STEP.search(t["statusMessage"]).group(0) == \
            "step 3/3"
    async with Client(_stdio(proj)) as plain:  # no task support declared: today's result
        started = await plain.call_tool("start_training", {"preset": "cpu-demo", "overrides": _overrides(model_dir)})
        assert not started.is_error and started.structured_content["run"]["run_id"], text(started)
        await plain.call_tool("stop_run", {"run_id": started.structured_content["run"]["run_id"], "force": True})

    async with Client(_stdio(proj), extensions=[Tasks()]) as again:  # a new server process
        assert (await get(again.session, stopped))["status"] == "cancelled"
        t = await get(again.session, finished)
        assert t["status"] == "completed" and t["result"]["structuredContent"]["summary"]["steps"] == 3
        assert "unknown run id 'nope'" in await _refused(again.session, "nope")
        assert "has the wrong form" in await _refused(again.session, "../../etc/passwd")
        assert CANARY not in str(t)
    async with Client(_stdio(proj), mode="legacy") as legacy:  # the 2025-11-25 form over stdio, the same tasks
        assert (await get(legacy.session, stopped))["status"] == "cancelled"
        assert (await result(legacy.session, finished))["structuredContent"]["run"]["run_id"] == finished


async def test_tasks_over_http_2025_11_25_survive_a_restart(proj, model_dir):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    def client(port):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {HTTP_TOKEN}"}, timeout=300)
        return Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http), mode="legacy")

    port = closed_port()
    proc = serve_http(proj, port, "--allow-path", str(model_dir))
    try:
        async with client(port) as c:
            assert c.session.protocol_version == "2025-11-25" and c.server_capabilities.tasks.requests.tools.call
            support = {t.name: t.execution and t.execution.task_support for t in (await c.list_tools()).tools}
            assert support["start_training"] == support["ablate"] == support["evaluate"] == "optional"
            assert support["run_status"] is None
            started = await legacy_call(c.session, "start_training", _long(model_dir))
            task = started.get("task") or pytest.fail(str(started))
            assert task["status"] == "working" and task["pollInterval"] == 2000 and task["ttl"] is None
            stopped = task["taskId"]
            polls = await _rising(c.session, stopped)
            last = int(STEP.search(polls[-1]["statusMessage"]).group(1))
            assert (await cancel(c.session, stopped))["taskId"] == stopped  # 2025-11-25: the task comes back
            await _until(c.session, stopped, "cancelled", timeout=180)
            _checkpoint_after_cancel(proj, stopped, last)

            finished = (await legacy_call(c.session, "start_training", {"preset": "cpu-demo", "overrides":
                                                                        _overrides(model_dir)}))["task"]["taskId"]
            res = await result(c.session, finished)  # waits for the end
            assert not res["isError"] and res["structuredContent"]["summary"]["steps"] == 3
            assert res["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": finished}
            assert (await get(c.session, finished))["status"] == "completed"

            plain = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": _overrides(model_dir)})
            assert not plain.is_error and plain.structured_content["run"]["run_id"], text(plain)
            await c.call_tool("stop_run", {"run_id": plain.structured_content["run"]["run_id"], "force": True})
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    port = closed_port()
    proc = serve_http(proj, port, "--allow-path", str(model_dir))  # a new server process, the same runs
    try:
        async with client(port) as c:
            assert (await get(c.session, stopped))["status"] == "cancelled"
            assert (await result(c.session, finished))["structuredContent"]["run"]["state"] == "succeeded"
            assert "unknown run id" in await _refused(c.session, "nope")
            assert "has the wrong form" in await _refused(c.session, "..%2Fetc")
            with pytest.raises(MCPError) as e:
                await legacy_call(c.session, "run_status", {"run_id": finished})
            assert "does not run as a task" in e.value.error.message and "start_training" in e.value.error.message
        async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {HTTP_TOKEN}"}, timeout=300)), extensions=[Tasks()]) as c:
            assert c.session.protocol_version == "2026-07-28"  # the extension form over HTTP, the same tasks
            t = await get(c.session, finished)
            assert t["status"] == "completed" and t["result"]["structuredContent"]["summary"]["steps"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def test_task_ids_ablations_evaluate_and_clients_without_tasks(proj, monkeypatch):
    from server.app import build_server
    with slot_held(proj / "logs"):
        async with Client(build_server()) as plain:  # declares nothing: plain results, no tasks/*
            res = await plain.call_tool("start_training", {"preset": "cpu-demo"})
            assert not res.is_error and res.structured_content["run"]["state"] == "queued"
            with pytest.raises(MCPError) as e:
                await get(plain.session, res.structured_content["run"]["run_id"])
            assert "io.modelcontextprotocol/tasks" in e.value.error.message
        async with Client(build_server(), extensions=[Tasks()]) as c:
            refused = await c.session.call_tool("start_training", {"preset": "no-such-preset"}, allow_claimed=True)
            assert refused.is_error and "unknown preset" in text(refused)  # refused before a run: no task
            abl = await c.session.call_tool("ablate", {"preset": "cpu-demo", "variants": ["vapo", "ppo"]},
                                            allow_claimed=True)
            assert abl.task_id.startswith("abl-") and "0/2 runs" in abl.status_message
            await cancel(c.session, abl.task_id)
            assert (await get(c.session, abl.task_id))["status"] == "cancelled"
            with pytest.raises(MCPError) as e:
                await cancel(c.session, abl.task_id)
            assert "already cancelled" in e.value.error.message
            assert "no ablation has this id" in await _refused(c.session, "abl-00000000")
            assert "forgotten when the server restarts" in await _refused(c.session, "task-0123")

            monkeypatch.setenv("TAOTOKEN_API_KEY", CANARY)
            with FakeOpenAI(key=CANARY, delay=0.2) as fake:
                monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
                args = {"benchmark": "builtin:addition", "num_problems": 3, "samples_per_problem": 0}
                ev = await c.session.call_tool("evaluate", args, allow_claimed=True)
                assert ev.status == "working"
                t = await _until(c.session, ev.task_id, "completed", timeout=60)
                assert not t["result"]["isError"] and t["result"]["structuredContent"]["problems"] == 3
                fake.delay = 30
                slow = await c.session.call_tool("evaluate", {**args, "timeout_seconds": 60}, allow_claimed=True)
                await cancel(c.session, slow.task_id)
                assert (await get(c.session, slow.task_id))["status"] == "cancelled"
