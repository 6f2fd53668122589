"""Helpers for tests that drive the MCP server in memory: a temp project, result text, a slot holder that keeps
every run a test submits queued (so no training process starts), and the "names a fix" criterion."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import write_workspace
from tests.fake_openai import CANARY

# An error names a fix when it says what to do: an imperative verb used as a word, "Fix:", the allowed values,
# a suggestion, or the tool to call next. Raw pydantic text, a bare "Error executing tool X" and "already
# stopped; nothing to stop" match none of these.
FIX = re.compile(r"(?i)\bfix:|\ballowed\b|did you mean|\bvalid (?:names|values|ones)?:|"
                 r"\b(?:use|set|call|pass|restart|export|create|put|add|remove|try|wait|write|save|"
                 r"generate|bind)\b|\b(?:list_runs|run_status|start_training|resume_run|stop_run|"
                 r"report_metrics|diagnose_error|check_channel|smoke_test)\b|\bablate\(")
LEAKS = ("Traceback", 'File "', "validation error for", "errors.pydantic.dev", "[type=", "input_value=")


def names_a_fix(message: str) -> bool:
    """`message` (without the SDK's "Error executing tool X:" prefix, which names a tool but no fix) matches FIX."""
    return bool(FIX.search(re.sub(r"^Error executing tool \w+:?", "", message)))


def text(res) -> str:
    return "".join(getattr(c, "text", "") for c in res.content)


def project(tmp_path: Path, monkeypatch) -> Path:
    """A project folder (config.toml, settings.json, runs under ./logs, an empty ./data) that the server's file
    environment points at, with a canary key, one run slot and no proxy."""
    ws = tmp_path / "project"
    ws.mkdir()
    write_workspace(ws)
    (ws / "data").mkdir()
    monkeypatch.setenv("VAPO_MCP_SETTINGS", str(ws / "settings.json"))
    monkeypatch.setenv("VAPO_MCP_CONFIG", str(ws / "config.toml"))
    monkeypatch.setenv("TAOTOKEN_API_KEY", CANARY)
    monkeypatch.setenv("VAPO_MCP_MAX_CONCURRENT", "1")  # one slot: what slot_held occupies
    monkeypatch.delenv("TAOTOKEN_BASE_URL", raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return ws


@contextmanager
def slot_held(runs_root: Path):
    """Occupy the run manager's only slot (VAPO_MCP_MAX_CONCURRENT defaults to 1) with a placeholder run whose
    'supervisor' is a sleeping process, so every run submitted inside the block stays queued and no trainer
    starts. On exit every run still queued or running is stopped and the placeholder process is gone."""
    from vapo_engine.jobs import RunManager
    from vapo_engine.jobs.states import State
    assert os.environ.get("VAPO_MCP_MAX_CONCURRENT", "1") == "1"
    mgr = RunManager(runs_root)
    holder_dir = runs_root / "slot-holder"
    holder_dir.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    mgr.registry.add("slot-holder", "tests", (), holder_dir)
    assert [r.run_id for r in mgr.registry.claim_queued(1)] == ["slot-holder"]
    mgr.registry.update("slot-holder", pid=sleeper.pid, heartbeat=time.time())
    try:
        yield lambda: mgr.registry.update("slot-holder", heartbeat=time.time())
    finally:
        for rec in mgr.registry.list(limit=10_000):
            if not rec.state.terminal and rec.run_id != "slot-holder":
                mgr.stop(rec.run_id, force=True)
        sleeper.kill()
        sleeper.wait(timeout=10)
        mgr.registry.transition("slot-holder", State.STOPPED, "test placeholder")


HTTP_TOKEN = "t0ken-" + "k" * 30


async def starts_refuse(proj: Path, overrides: list[str], preset_file: Path, field: str, where: str) -> None:
    """Over stdio, start_training (with `overrides`, then with `preset_file`) and ablate each refuse a change of
    config field `field`, naming where it may be set (`where`) and a fix."""
    from mcp import Client

    from server.app import build_server
    with slot_held(proj / "logs"):
        async with Client(build_server()) as c:
            for tool, args in (("start_training", {"preset": "cpu-demo", "overrides": overrides}),
                               ("start_training", {"preset": str(preset_file)}),
                               ("ablate", {"preset": "cpu-demo", "overrides": overrides, "variants": ["vapo"]})):
                res = await c.call_tool(tool, args)
                msg = text(res)
                assert res.is_error and f"{field} differs from config.toml's" in msg, msg
                assert where in msg and names_a_fix(msg)


def serve_http(ws: Path, port: int, *extra: str, token: str = HTTP_TOKEN, env: dict | None = None
               ) -> subprocess.Popen:
    """`vapo-mcp serve --http` for the project `ws` on 127.0.0.1:`port` (a real process), once /health answers."""
    import httpx
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--http", "--port", str(port),
                             "--config", str(ws / "config.toml"), "--settings", str(ws / "settings.json"), *extra],
                            env={**os.environ, "VAPO_MCP_TOKEN": token, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
    proc.kill()
    raise AssertionError("the HTTP server did not answer /health within a minute")


async def call_http(port: int, tool: str, args: dict, token: str = HTTP_TOKEN):
    """One MCP tool call over streamable HTTP with the bearer token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300)
    async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c:
        return await c.call_tool(tool, args)


@contextmanager
def uvicorn_in_thread(app, **config):
    """`app` on a real uvicorn server on 127.0.0.1 in a thread (extra uvicorn.Config arguments in `config`);
    yields its port, and stops it on exit."""
    import threading

    import uvicorn

    from tests.fake_openai import closed_port
    port = closed_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=20)

