"""The MCP server: every tool through the SDK's in-memory Client (real tools, real loopback API fake,
real training runs), error paths as ToolErrors, stdio end to end, HTTP with and without the bearer token."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import write_workspace
from tests.engine_helpers import FAST
from tests.fake_openai import CANARY, FakeOpenAI, closed_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """settings/config in tmp (runs under tmp/logs), the server's file env pointing at them, a canary key."""
    write_workspace(tmp_path)
    monkeypatch.setenv("VAPO_MCP_SETTINGS", str(tmp_path / "settings.json"))
    monkeypatch.setenv("VAPO_MCP_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("TAOTOKEN_API_KEY", CANARY)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _over(model_dir, *extra):
    return [*FAST, f'model.local_path="{model_dir}"', *extra]


def _text(res) -> str:
    return "".join(getattr(c, "text", "") for c in res.content)


async def test_tools_listed_with_annotations_and_bounded_inputs(workspace):
    from server.app import build_server
    async with Client(build_server()) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {"check_channel", "smoke_test", "diagnose_error", "start_training", "ablate", "doctor",
                          "report_metrics", "list_runs", "run_status", "stop_run", "resume_run", "evaluate"}
    assert tools["stop_run"].annotations.destructive_hint and tools["list_runs"].annotations.read_only_hint
    assert tools["report_metrics"].input_schema["properties"]["limit"]["maximum"] == 500
    assert all(t.description and len(t.description) > 40 for t in tools.values())


async def test_channel_tools_against_loopback_fake(workspace, monkeypatch):
    from server.app import build_server
    with FakeOpenAI(key=CANARY) as fake:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        async with Client(build_server()) as c:
            rep = await c.call_tool("check_channel", {})
            smoke = await c.call_tool("smoke_test", {"stream": True})
            diag = await c.call_tool("diagnose_error", {"status": 401, "body": '{"error": {"message": '
                                                                             '"Incorrect API key"}}'})
    assert not rep.is_error and rep.structured_content["ok"] is True
    assert not smoke.is_error and smoke.structured_content["passed"] is True
    assert smoke.structured_content["model_used"] == "qwen-32b"
    ids = [f["rule_id"] for f in diag.structured_content["findings"]]
    assert any(i.startswith("http-401") for i in ids)
    for res in (rep, smoke, diag):
        assert CANARY not in json.dumps(res.structured_content) and CANARY not in _text(res)


async def test_error_paths_are_tool_errors_with_fixes(workspace, model_dir):
    from server.app import build_server
    async with Client(build_server()) as c:
        bad = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": ["vapo.alpah=1"]})
        assert bad.is_error and "did you mean vapo.alpha" in _text(bad)
        bad = await c.call_tool("start_training", {"overrides": ["training.batch_size=60"]})
        assert bad.is_error and "training.batch_size" in _text(bad)
        bad = await c.call_tool("start_training", {"preset": "nope"})
        assert bad.is_error and "cpu-demo" in _text(bad)
        bad = await c.call_tool("start_training", {"overrides": ["eval.benchmark=missing_set"]})
        assert bad.is_error and "missing_set.jsonl" in _text(bad)
        for tool in ("run_status", "stop_run", "resume_run", "report_metrics"):
            bad = await c.call_tool(tool, {"run_id": "20990101-000000-abcdef"})
            assert bad.is_error and "unknown run id" in _text(bad), tool
        bad = await c.call_tool("report_metrics", {"run_id": "x", "limit": 0})
        assert bad.is_error
        bad = await c.call_tool("ablate", {"variants": ["no_such_variant"]})
        assert bad.is_error
        bad = await c.call_tool("diagnose_error", {"status": 9999})
        assert bad.is_error
        bad = await c.call_tool("report_metrics", {"run_id": "abl-00000000"})
        assert bad.is_error and "ablation" in _text(bad)
        for field in ("base_url", "api_key", "api_key_env"):  # the channel is never a tool's to set
            bad = await c.call_tool("start_training", {"provider_samples": {"enabled": True, field: "x"}})
            assert bad.is_error and field in _text(bad), field
        bad = await c.call_tool("start_training", {"provider_samples": {"concurrency": 0}})
        assert bad.is_error and "concurrency" in _text(bad)


async def test_training_through_tools_in_memory(workspace, model_dir):
    from server.app import build_server
    from tools.paths import files, manager_for
    async with Client(build_server()) as c:
        started = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": _over(model_dir),
                                                       "tags": ["mem"]})
        assert not started.is_error, _text(started)
        run_id = started.structured_content["run"]["run_id"]
        mgr, _ = manager_for(files())
        assert mgr.wait(run_id, timeout=240).state.value == "succeeded"
        st = await c.call_tool("run_status", {"run_id": run_id})
        assert st.structured_content["run"]["state"] == "succeeded"
        rep = await c.call_tool("report_metrics", {"run_id": run_id, "limit": 2})
        assert rep.structured_content["run"]["next_cursor"] == 2
        assert any(getattr(x, "type", "") == "image" for x in rep.content)
        runs = await c.call_tool("list_runs", {"tag": "mem"})
        assert [r["run_id"] for r in runs.structured_content["runs"]] == [run_id]
        diag = await c.call_tool("diagnose_error", {"run_id": run_id, "check_config": False})
        assert not diag.is_error
        stop = await c.call_tool("stop_run", {"run_id": run_id})
        assert stop.is_error and "already succeeded" in _text(stop)
        abl = await c.call_tool("ablate", {"variants": ["no_clip_higher"], "preset": "cpu-demo",
                                           "overrides": _over(model_dir)})
        assert not abl.is_error, _text(abl)
        aid = abl.structured_content["ablation_id"]
        for r in abl.structured_content["runs"]:
            assert mgr.wait(r["run_id"], timeout=240).state.value == "succeeded"
        table = await c.call_tool("report_metrics", {"run_id": aid})
        rows = table.structured_content["ablation"]["rows"]
        assert {r["variant"] for r in rows} == {"vapo", "no_clip_higher"}
        assert table.structured_content["ablation"]["done"] and "| vapo |" in \
            table.structured_content["ablation"]["table_markdown"]


def _stdio(workspace) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env.update(TAOTOKEN_API_KEY=CANARY, HF_HUB_OFFLINE="1")
    return StdioServerParameters(command=sys.executable, args=["-m", "server.cli", "serve", "--config",
                                 str(workspace / "config.toml"), "--settings", str(workspace / "settings.json")],
                                 env=env, cwd=str(workspace))


async def _poll(c, run_id, timeout=300):
    end = time.time() + timeout
    while time.time() < end:
        st = await c.call_tool("run_status", {"run_id": run_id})
        if st.structured_content["run"]["state"] in ("succeeded", "failed", "stopped"):
            return st.structured_content
        await anyio.sleep(1)
    raise AssertionError("run did not finish")


async def test_stdio_end_to_end_and_run_survives_server_exit(workspace, model_dir):
    async with Client(_stdio(workspace)) as c:
        started = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": _over(
            model_dir, "training.total_steps=6")})
        run_id = started.structured_content["run"]["run_id"]
    # the server process is gone now; the detached run goes on. A new server sees it and its end.
    async with Client(_stdio(workspace)) as c:
        runs = await c.call_tool("list_runs", {})
        assert run_id in [r["run_id"] for r in runs.structured_content["runs"]]
        st = await _poll(c, run_id)
        assert st["run"]["state"] == "succeeded", st["log_tail"]
        rep = await c.call_tool("report_metrics", {"run_id": run_id})
        assert any(getattr(x, "type", "") == "image" for x in rep.content)
        assert rep.structured_content["run"]["step"] == 6
        diag = await c.call_tool("diagnose_error", {"run_id": run_id})
        assert not diag.is_error and "findings" in diag.structured_content


def test_http_mode_requires_the_bearer_token(workspace):
    port, token = closed_port(), "t0ken-" + "x" * 30
    env = dict(os.environ, VAPO_MCP_TOKEN=token)
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--http", "--port", str(port),
                             "--config", str(workspace / "config.toml"), "--settings",
                             str(workspace / "settings.json")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        hdr = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        assert httpx.post(base + "/mcp", json=init, headers=hdr).status_code == 401
        bad = httpx.post(base + "/mcp", json=init, headers={**hdr, "Authorization": "Bearer wrong"})
        assert bad.status_code == 401
        ok = httpx.post(base + "/mcp", json=init, headers={**hdr, "Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and "vapo-mcp" in ok.text
        evil = httpx.post(base + "/mcp", json=init, headers={**hdr, "Authorization": f"Bearer {token}",
                                                              "Host": "evil.example:80"})
        assert evil.status_code in (403, 421)  # DNS-rebinding protection
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    r = subprocess.run(check=False, args=[sys.executable, "-m", "server.cli", "serve", "--http", "--host", "0.0.0.0"],
                       env={k: v for k, v in os.environ.items() if k != "VAPO_MCP_TOKEN"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "VAPO_MCP_TOKEN" in r.stderr and "Traceback" not in r.stderr
