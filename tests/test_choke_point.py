"""What leaves the MCP server passes one choke point (server/scrubbing.py, docs/security.md "What holds for every
caller"): a key the caller sends never comes back, prompt and resource errors carry the spec's codes without a
traceback, and stdio answers a line it cannot decode. Each reproduction as it was found:

- the channel's key, known only by value (no `sk-` prefix), sent as a tool name, an argument name, a preset,
  a prompt's arguments, a resource URI and a method name, came back in the answers and in the server log;
- over stdio, `prompts/get` of an unknown prompt or without a required argument answered JSON-RPC error code 0
  and logged a traceback;
- over stdio, a request holding a lone surrogate ("\\ud800") was dropped unanswered (the client waits forever).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from tests.conftest import ROOT
from tests.mcp_helpers import project

pytestmark = pytest.mark.anyio
KEY = "tT9xQ2mN7pL4vR8kW3jH6cB1"
"""A key with no recognisable shape: only its value tells it is the key."""
ANY = TypeAdapter(dict)


async def _raw(session, method: str, params: dict):
    data: dict = {"method": method, "params": params}
    opts: dict = {}
    session._stamp(data, opts)
    return await session._dispatcher.send_raw_request(method, data["params"], opts)


async def test_a_key_sent_by_the_caller_never_comes_back(tmp_path, monkeypatch, caplog):
    from server.app import build_server
    project(tmp_path, monkeypatch)
    monkeypatch.setenv("TAOTOKEN_API_KEY", KEY)
    monkeypatch.setenv("TAOTOKEN_BASE_URL", "http://127.0.0.1:9/v1")
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with Client(build_server()) as c:
        for tool, args in [(f"tool{KEY}", {}), ("list_runs", {KEY: 1}), ("doctor", {"preset": KEY}),
                           ("start_training", {"preset": f"x{KEY}.toml"}), ("run_status", {"run_id": KEY})]:
            res = await c.call_tool(tool, args)
            assert res.is_error or tool == "doctor"  # doctor reports the unknown preset as a finding
            seen.append(json.dumps(res.model_dump(mode="json")))
        prompt = await c.get_prompt("train_and_watch", {"model_path": KEY, "preset": KEY, "benchmark": KEY})
        seen.append(json.dumps(prompt.model_dump(mode="json")))
        assert "model.local_path" in seen[-1]  # the prompt still names the override, with the key redacted
        for call in (lambda: c.get_prompt(f"p{KEY}", {}), lambda: c.read_resource(f"vapo://x/{KEY}"),
                     lambda: c.get_prompt("diagnose_api_error", {"error": "e", KEY: "1"}),
                     lambda: _raw(c.session, f"m/{KEY}", {})):
            with pytest.raises(MCPError) as e:
                await call()
            assert e.value.error.code in (-32602, -32601)
            seen.append(json.dumps(e.value.error.model_dump(mode="json")))
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert not [s for s in seen if KEY in s], [s[:300] for s in seen if KEY in s]
    assert not [m for m in logged if KEY in m], [m[:300] for m in logged if KEY in m]
    assert not [r for r in caplog.records if r.exc_info], "a caller's mistake logged a traceback"


def _until_answered(proc, ids: list[str]) -> dict:
    """The server's answers by JSON id, read until each of `ids` has one (a missing one times the test out)."""
    got: dict = {}
    while not set(ids) <= set(got):
        line = proc.stdout.readline()
        assert line, f"the server closed stdout; answered only {sorted(got)}"
        msg = json.loads(line)
        if "id" in msg:
            got[json.dumps(msg["id"])] = msg
    return got


INIT = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})]


def _stdio_answers(tmp_path, lines: list[str], ids: list[str]) -> tuple[dict, str]:
    """Send `lines` to a real `vapo-mcp serve` (stdio) after the handshake; its answers by id, and its stderr."""
    from tests.conftest import write_workspace
    write_workspace(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--config", str(tmp_path / "config.toml"),
                             "--settings", str(tmp_path / "settings.json")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True, env=env)
    try:
        proc.stdin.write("\n".join([*INIT, *lines]) + "\n")
        proc.stdin.flush()
        got = _until_answered(proc, ["1", *ids])
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return got, proc.stderr.read()


def test_stdio_prompt_errors_carry_the_specs_code_and_no_traceback(tmp_path):
    got, stderr = _stdio_answers(tmp_path, [
        '{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"nope"}}',
        '{"jsonrpc":"2.0","id":5,"method":"prompts/get","params":{"name":"diagnose_api_error","arguments":{}}}',
        '{"jsonrpc":"2.0","id":6,"method":"prompts/get","params":{"name":"train_and_watch","arguments":{"steps":"x"}}}'],
        ["4", "5", "6"])
    assert got["4"]["error"]["code"] == -32602 and "unknown prompt 'nope'" in got["4"]["error"]["message"]
    assert got["5"]["error"]["code"] == -32602 and "'error' is required" in got["5"]["error"]["message"]
    assert got["6"]["error"]["code"] == -32602 and "'steps'" in got["6"]["error"]["message"]
    assert "Traceback" not in stderr, stderr[-2000:]


def test_stdio_answers_a_line_it_cannot_decode(tmp_path):
    """A lone surrogate: -32600 with the request's id; a line that is not one JSON message: -32700 with id null;
    the next request is answered as usual."""
    got, stderr = _stdio_answers(tmp_path, [
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_runs","arguments":{"tag":"\\ud800"}}}',
        '{"jsonrpc":"2.0","id":3,"method":"ping"} trailing', '{"jsonrpc":"2.0","id":7,"method":"ping"}'],
        ["2", "null", "7"])
    assert got["2"]["error"]["code"] == -32600 and "lone surrogate" in got["2"]["error"]["message"]
    assert got["null"]["error"]["code"] == -32700
    assert got["7"]["result"] == {}
    assert "Traceback" not in stderr, stderr[-2000:]
