"""A start refused by the queue bound leaves nothing behind (tools/training.py). The reproduction: 12 concurrent
start_training calls against a queue bound of 3 — each passes the early room check, then the registry refuses
those beyond the bound — left the run directories of the refused ones (7 of 12) on disk, runs nobody could see,
resume or stop. Real concurrency: the in-memory MCP server runs each call in a worker thread."""
from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client

from tests.mcp_helpers import slot_held, text

pytestmark = pytest.mark.anyio


async def test_concurrent_starts_refused_by_the_queue_leave_no_run_directory(proj):
    from server.app import build_server
    settings = json.loads((proj / "settings.json").read_text())
    settings["runtime"]["max_queued_runs"] = 3
    (proj / "settings.json").write_text(json.dumps(settings))
    results = []
    with slot_held(proj / "logs"):
        async with Client(build_server()) as c:
            async def start():
                results.append(await c.call_tool("start_training", {"preset": "cpu-demo"}))
            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(start)
        started = {r.structured_content["run"]["run_id"] for r in results if not r.is_error}
        refused = [text(r) for r in results if r.is_error]
        on_disk = {p.parent.name for p in (proj / "logs").rglob("run.json")} - {"slot-holder"}
    assert len(started) == 3 and len(refused) == 9 and all("queue" in m for m in refused), refused[:2]
    assert on_disk == started  # no directory of a refused start is left
