"""MCP resources of runs and prompts (docs/mcp.md "Resources", "Prompts"): resources listed and read over stdio and streamable
HTTP; a bad run id or a file resolving outside the allowed roots refused with the tools' own message; subscribers
notified when a run changes state (subscriptions/listen over HTTP, resources/subscribe in memory) and when a real
tiny run finishes (subscriptions/listen over stdio);
the poller runs only while someone is subscribed; prompts listed and filled in with the right tool calls."""
from __future__ import annotations

import base64
import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import ResourceUpdatedNotification

from tests.engine_helpers import FAST
from tests.fake_openai import CANARY, closed_port
from tests.mcp_helpers import HTTP_TOKEN, serve_http, slot_held, text

pytestmark = pytest.mark.anyio
RUN_URIS = ("", "/metrics", "/log", "/plot.png", "/config")


def _queued_run(ws) -> str:
    """A cpu-demo run that stays queued (the caller holds the only slot), started through the tools' function."""
    from tools import training
    from tools.paths import files
    return training.start_training(files(), preset="cpu-demo").run.run_id


async def _refused(c, uri: str) -> str:
    with pytest.raises(MCPError) as e:
        await c.read_resource(uri)
    return e.value.error.message


def _runs_root(ws):
    return ws / "logs"


async def test_resources_over_http_refuse_bad_ids_and_outside_paths_like_the_tools(proj, tmp_path):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    outside = tmp_path / "outside.log"
    outside.write_text("OUTSIDE-CONTENT " + CANARY)
    with slot_held(_runs_root(proj)):
        plain, run_id = _queued_run(proj), _queued_run(proj)
        from tools.paths import files
        from tools.training import views_for
        log_link = views_for(files()).get(run_id).rundir.file("worker.log")
        log_link.symlink_to(outside)
        port = closed_port()
        proc = serve_http(proj, port)
        try:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {HTTP_TOKEN}"}, timeout=120)
            async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c:
                assert [str(r.uri) for r in (await c.list_resources()).resources] == ["vapo://runs"]
                templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
                assert templates == {f"vapo://runs/{{run_id}}{p}" for p in RUN_URIS}
                listed = json.loads((await c.read_resource("vapo://runs")).contents[0].text)
                assert {plain, run_id} <= {r["run_id"] for r in listed["runs"]}
                status = json.loads((await c.read_resource(f"vapo://runs/{plain}")).contents[0].text)
                assert status["run"]["state"] == "queued" and status["next_steps"]
                metrics = json.loads((await c.read_resource(f"vapo://runs/{plain}/metrics")).contents[0].text)
                assert metrics["records"] == [] and metrics["step"] == 0
                assert (await c.read_resource(f"vapo://runs/{plain}/log")).contents[0].text == ""
                async with c.listen(resource_subscriptions=[f"vapo://runs/{plain}"]) as sub:
                    assert not (await c.call_tool("stop_run", {"run_id": plain})).is_error
                    with anyio.fail_after(30):
                        assert (await sub.__anext__()).uri == f"vapo://runs/{plain}"
                config = json.loads((await c.read_resource(f"vapo://runs/{run_id}/config")).contents[0].text)
                assert config["config"]["training"]["total_steps"] > 0 and config["channel"]["key"] != CANARY
                assert "no metrics yet" in await _refused(c, f"vapo://runs/{run_id}/plot.png")

                # a file of the run that resolves outside the roots: the tools' fixed refusal, nothing of the file
                refused = await _refused(c, f"vapo://runs/{run_id}/log")
                tool = text(await c.call_tool("diagnose_error", {"log_path": str(log_link), "check_config": False}))
                assert "is outside the allowed roots" in refused and "--allow-path" in refused
                assert refused.partition("' is outside")[2] == tool.partition("' is outside")[2]
                for uri in (f"vapo://runs/{run_id}", f"vapo://runs/{run_id}/log"):
                    assert "OUTSIDE-CONTENT" not in await _refused(c, uri)

                # ids that are no run id (a path, traversal, encoded separators): the tools' argument message
                for bad in ("..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", ".hidden", "a%20b"):
                    for part in ("", "/log", "/config"):
                        msg = await _refused(c, f"vapo://runs/{bad}{part}")
                        assert "argument 'run_id'" in msg and "has the wrong form" in msg, msg
                tool = text(await c.call_tool("run_status", {"run_id": "../../etc/passwd"}))
                assert await _refused(c, "vapo://runs/..%2F..%2Fetc%2Fpasswd") in tool
                tool = text(await c.call_tool("run_status", {"run_id": "nope"}))
                assert (await _refused(c, "vapo://runs/nope/metrics")) in tool
        finally:
            proc.terminate()
            proc.wait(timeout=20)


@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")
async def test_legacy_subscriber_is_told_when_a_run_changes_state(proj):
    from server.app import build_server
    got: list[str] = []
    arrived = anyio.Event()

    async def on_message(message):
        if isinstance(message, ResourceUpdatedNotification):
            got.append(message.params.uri)
            arrived.set()

    with slot_held(_runs_root(proj)):
        run_id = _queued_run(proj)
        async with Client(build_server(), mode="legacy", message_handler=on_message) as c:
            assert c.server_capabilities.resources.subscribe
            await c.session.subscribe_resource(f"vapo://runs/{run_id}")
            await anyio.sleep(0.3)
            assert not got  # subscribing announces nothing; a change after it is announced
            stopped = await c.call_tool("stop_run", {"run_id": run_id})
            assert not stopped.is_error, text(stopped)
            with anyio.fail_after(30):
                await arrived.wait()
            assert got == [f"vapo://runs/{run_id}"]  # only what this client subscribed to
            status = json.loads((await c.read_resource(f"vapo://runs/{run_id}")).contents[0].text)
            assert status["run"]["state"] == "stopped"


async def test_the_poller_runs_only_while_someone_is_subscribed(proj):
    from server.subscriptions import RunWatch
    watch = RunWatch(interval=0.05)
    assert watch._task is None
    stop = watch.bus.subscribe(lambda event: None)
    assert watch.bus.listeners == 1 and watch._task is not None
    await anyio.sleep(0.3)
    stop()
    stop()  # idempotent
    with anyio.fail_after(10):
        while watch._task is not None:
            await anyio.sleep(0.05)
    assert watch.bus.listeners == 0


async def test_prompts_are_listed_and_fill_in_the_tool_calls(proj):
    from server.app import build_server
    async with Client(build_server()) as c:
        prompts = {p.name: p for p in (await c.list_prompts()).prompts}
        assert set(prompts) == {"diagnose_api_error", "train_and_watch", "compare_checkpoints"}
        assert all(p.description and p.title for p in prompts.values())
        assert [a.name for a in prompts["compare_checkpoints"].arguments if a.required] == \
            ["checkpoint_a", "checkpoint_b"]

        async def message(name, args):
            res = await c.get_prompt(name, args)
            assert len(res.messages) == 1 and res.messages[0].role == "user"
            return res.messages[0].content.text

        diag = await message("diagnose_api_error", {"error": json.dumps({"error": {"message": f"bad key {CANARY}"}}),
                                                    "status": "401"})
        assert '`diagnose_error` with arguments {"status": 401, "body": ' in diag
        assert "`check_channel`" in diag and "`smoke_test`" in diag and CANARY not in diag
        assert '"text": "Traceback' in await message("diagnose_api_error", {"error": "Traceback: boom"})

        train = await message("train_and_watch", {"model_path": "/models/my-qwen", "steps": "40"})
        assert ('`start_training` with arguments {"overrides": ["model.local_path=\\"/models/my-qwen\\"", '
                '"training.total_steps=40"]}') in train
        for tool in ("run_status", "report_metrics", "diagnose_error", "resume_run", "stop_run"):
            assert f"`{tool}`" in train
        assert "vapo://runs/RUN_ID" in train
        assert '{"preset": "cpu-demo"}' in await message("train_and_watch", {})

        cmp = await message("compare_checkpoints", {"checkpoint_a": "r1@4", "checkpoint_b": "r2",
                                                    "benchmark": "builtin:chain", "num_problems": "20"})
        assert ('`evaluate` with arguments {"backend": "local", "run_id": "r1", "step": 4, "benchmark": '
                '"builtin:chain", "num_problems": 20}') in cmp
        assert '{"backend": "local", "run_id": "r2", "benchmark": "builtin:chain", "num_problems": 20}' in cmp

        tool = text(await c.call_tool("run_status", {"run_id": "../x"}))
        for name, args, arg in (("compare_checkpoints", {"checkpoint_a": "../x", "checkpoint_b": "r2"}, "run_id"),
                                ("compare_checkpoints", {"checkpoint_a": "r@x", "checkpoint_b": "r2"}, "step"),
                                ("train_and_watch", {"steps": "0"}, "steps"),
                                ("diagnose_api_error", {"error": "e", "status": "42"}, "status")):
            with pytest.raises(MCPError) as e:
                await c.get_prompt(name, args)
            assert f"argument {arg!r}" in e.value.error.message, e.value.error.message
        with pytest.raises(MCPError) as e:
            await c.get_prompt("compare_checkpoints", {"checkpoint_a": "../x", "checkpoint_b": "r2"})
        assert e.value.error.message == tool


@pytest.mark.timeout(600)
async def test_resources_over_stdio_and_a_listener_is_told_when_the_run_finishes(proj, model_dir):
    from tests.test_server import _stdio
    async with Client(_stdio(proj)) as c:
        assert c.server_capabilities.resources.subscribe
        async with c.listen(resource_subscriptions=["vapo://runs"]) as runs_sub:
            started = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": [
                *FAST, f'model.local_path="{model_dir}"']})
            assert not started.is_error, text(started)
            run_id = started.structured_content["run"]["run_id"]
            with anyio.fail_after(60):
                assert (await runs_sub.__anext__()).uri == "vapo://runs"  # the new run (or its start)
            state, events = None, []
            # the list listener stays open, so the poller keeps its view of the runs while the run's opens
            async with c.listen(resource_subscriptions=[f"vapo://runs/{run_id}"]) as sub:
                with anyio.fail_after(480):
                    async for event in sub:
                        events.append(event.uri)
                        status = json.loads((await c.read_resource(f"vapo://runs/{run_id}")).contents[0].text)
                        state = status["run"]["state"]
                        if state in ("succeeded", "failed", "stopped"):
                            break
        assert state == "succeeded", status["log_tail"]
        assert set(events) == {f"vapo://runs/{run_id}"}

        listed = json.loads((await c.read_resource("vapo://runs")).contents[0].text)
        assert [r["state"] for r in listed["runs"] if r["run_id"] == run_id] == ["succeeded"]
        metrics = json.loads((await c.read_resource(f"vapo://runs/{run_id}/metrics")).contents[0].text)
        assert metrics["step"] == 3 and {r["kind"] for r in metrics["records"]} >= {"train", "eval"}
        log = (await c.read_resource(f"vapo://runs/{run_id}/log")).contents[0]
        assert log.mime_type == "text/plain" and log.text.strip()
        png = (await c.read_resource(f"vapo://runs/{run_id}/plot.png")).contents[0]
        assert png.mime_type == "image/png" and base64.b64decode(png.blob)[:8] == b"\x89PNG\r\n\x1a\n"
        config = (await c.read_resource(f"vapo://runs/{run_id}/config")).contents[0]
        assert json.loads(config.text)["config"]["training"]["total_steps"] == 3
        for content in (log.text, config.text, json.dumps(metrics), json.dumps(listed)):
            assert CANARY not in content
