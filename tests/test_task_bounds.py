"""Tasks are bounded and end when they should (docs/security.md "Bounds"), each reproduction as it was found:

- 30 task-augmented `evaluate` calls were all accepted: the server's memory grew by gigabytes (a Python task per
  planned request), and the API key carried as many requests in flight as the calls allowed (8 each); nothing
  bounded a call's requests. Now 2 run, 8 wait, the next is refused with the fix; requests in flight stay within
  2 × 8; a call beyond the hourly request budget is refused; cancelling frees every turn.
- `tasks/cancel` of a local `evaluate` task marked it cancelled while its worker process ran on to its timeout.
- an HTTP client that asked `tasks/result` (2025-11-25) and went away left the server polling every 2 s until
  the run ended.
- `tasks/list` and `tasks/result` (2025-11-25 only) were answered to 2026-07-28 clients.
"""
from __future__ import annotations

import json
import os
import time

import anyio
import httpx
import psutil
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.fake_openai import CANARY, FakeOpenAI
from tests.mcp_helpers import HTTP_TOKEN, names_a_fix, slot_held, text, uvicorn_in_thread
from tests.task_client import Tasks, cancel, get, legacy_call

pytestmark = pytest.mark.anyio
SMALL = {"benchmark": "builtin:addition", "num_problems": 40, "samples_per_problem": 4, "timeout_seconds": 600}


async def test_evaluate_tasks_are_bounded_and_cancel_frees_them(proj, monkeypatch):
    from server.app import build_server
    with FakeOpenAI(key=CANARY, delay=0.3) as fake:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        server = build_server()
        async with Client(server, extensions=[Tasks()]) as c:
            answers = [await c.session.call_tool("evaluate", SMALL, allow_claimed=True) for _ in range(12)]
            tasks = [a.task_id for a in answers if getattr(a, "result_type", "") == "task"]
            refused = [a for a in answers if getattr(a, "is_error", False)]
            assert len(tasks) == 10 and len(refused) == 2, answers
            assert "too many evaluations" in text(refused[0]) and names_a_fix(text(refused[0]))
            await anyio.sleep(2)
            assert 0 < fake.max_in_flight <= 2 * 8  # 2 evaluations at a time, 8 requests each
            async with Client(server) as plain_client:  # plain calls count against the same bound
                plain = await plain_client.call_tool("evaluate", SMALL)
            assert plain.is_error and "too many evaluations" in text(plain)
            for t in tasks:
                await cancel(c.session, t)
            await anyio.sleep(0.5)
            sent = fake.count("POST /v1/chat/completions")
            await anyio.sleep(1.5)
            assert fake.count("POST /v1/chat/completions") == sent  # nothing is sent after the cancel
            assert [(await get(c.session, t))["status"] for t in tasks] == ["cancelled"] * 10

            big = {**SMALL, "num_problems": 1000, "samples_per_problem": 16}  # 17,000 requests at most
            two = [(await c.session.call_tool("evaluate", big, allow_claimed=True)).task_id for _ in range(2)]
            done, running = await _one_done(c.session, two)  # whichever reserved the budget second
            assert "budget" in json.dumps(done["result"]) and names_a_fix(json.dumps(done["result"]))
            await cancel(c.session, running)


async def _one_done(session, task_ids: list[str]) -> tuple[dict, str]:
    """The first of two tasks to finish, and the id of the other (still working)."""
    for _ in range(100):
        states = [await get(session, t) for t in task_ids]
        done = [s for s in states if s["status"] != "working"]
        if done:
            assert len(done) == 1, states
            return done[0], next(t for t in task_ids if t != done[0]["taskId"])
        await anyio.sleep(0.1)
    raise AssertionError(f"both tasks still working: {task_ids}")


def _eval_workers() -> list[psutil.Process]:
    """This process's local evaluation workers that are alive (a zombie of an earlier test is not one)."""
    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "vapo_engine.serving.local_eval" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:  # gone, or a zombie, meanwhile
            pass
    return out


async def test_cancelling_a_local_evaluation_stops_its_worker(proj, model_dir):
    from server.app import build_server
    from tests.serving_helpers import run_with_checkpoint
    from tools.paths import files, manager_for
    run_with_checkpoint(files(), manager_for(files())[0], model_dir, step=2)
    async with Client(build_server(), extensions=[Tasks()]) as c:
        long = {"backend": "local", "run_id": "served-run", "benchmark": "builtin:addition", "num_problems": 1000,
                "samples_per_problem": 16, "max_tokens": 2000, "timeout_seconds": 3600}
        handle = await c.session.call_tool("evaluate", long, allow_claimed=True)
        end = time.time() + 30
        while not (workers := _eval_workers()) and time.time() < end:
            await anyio.sleep(0.1)
        assert workers, "the local evaluation worker did not start"
        await cancel(c.session, handle.task_id)
        try:
            end = time.time() + 5
            while _eval_workers() and time.time() < end:  # the event loop runs meanwhile (the server is in it)
                await anyio.sleep(0.1)
            assert not _eval_workers(), "the worker of a cancelled evaluate task is still running"
        finally:
            for p in _eval_workers():
                p.kill()
        assert (await get(c.session, handle.task_id))["status"] == "cancelled"


def test_an_abandoned_tasks_result_stops_polling(proj, monkeypatch):
    """A real uvicorn server on loopback; the client asks tasks/result for a queued run and hangs up."""
    from server.app import build_server
    from server.http import http_app
    from tools import run_tasks
    from tools.access import Policy
    polls = []
    real = run_tasks.task_of
    monkeypatch.setattr(run_tasks, "task_of", lambda *a: polls.append(time.time()) or real(*a))
    app = http_app(build_server(Policy("http")), host="127.0.0.1", token=HTTP_TOKEN)
    with slot_held(proj / "logs"), uvicorn_in_thread(app) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        head = {"Authorization": f"Bearer {HTTP_TOKEN}", "Accept": "application/json, text/event-stream"}
        with httpx.Client(timeout=30) as http:
            init = http.post(url, headers=head, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
            head["Mcp-Session-Id"] = init.headers["mcp-session-id"]
            head["Mcp-Protocol-Version"] = "2025-11-25"
            http.post(url, headers=head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            started = http.post(url, headers=head, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "start_training", "arguments": {"preset": "cpu-demo"}, "task": {"ttl": 60000}}})
            task_id = json.loads(started.text.split("data: ")[-1])["result"]["task"]["taskId"]
            with http.stream("POST", url, headers=head, json={"jsonrpc": "2.0", "id": 3, "method": "tasks/result",
                                                              "params": {"taskId": task_id}}) as waiting:
                assert waiting.status_code == 200
                time.sleep(2.5)
                assert len(polls) >= 2  # it waits, polling
        hung_up = time.time()  # the client is gone (its connection closed)
        time.sleep(4.5)
        late = [t for t in polls if t > hung_up + 0.5]
        assert not late, f"{len(late)} polls after the client went away"


async def test_tasks_list_and_result_are_2025_11_25_only(proj):
    from mcp_types import ListTasksRequest

    from server.app import build_server
    from tests.task_client import ANY, result
    with slot_held(proj / "logs"):
        async with Client(build_server(), extensions=[Tasks()]) as c:
            assert c.session.protocol_version == "2026-07-28"
            handle = await c.session.call_tool("start_training", {"preset": "cpu-demo"}, allow_claimed=True)
            for call in (lambda: c.session.send_request(ListTasksRequest(), ANY),
                         lambda: result(c.session, handle.task_id)):
                with pytest.raises(MCPError) as e:
                    await call()
                assert e.value.error.code == -32601
        async with Client(build_server(), mode="legacy") as legacy:
            listed = await legacy.session.send_request(ListTasksRequest(), ANY)
            assert handle.task_id in [t["taskId"] for t in listed["tasks"]]
            assert (await legacy_call(legacy.session, "start_training", {"preset": "cpu-demo"}))["task"]
