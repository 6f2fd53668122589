"""Tools from MCP servers (docs/design.md §3.14, vapo_engine/rollout/mcp_tools.py): real servers over stdio and streamable HTTP;
every fault — a server that hangs, crashes mid-run, answers 10 MB, writes invalid JSON, or is not on PATH — is an
observation for the policy or one clear line at start, never a failed run. The built-in calculator."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from server.tool_servers.calculator import CalcError, calculate
from tests.conftest import ROOT
from vapo_engine.config.tools_model import ToolsConfig
from vapo_engine.rollout.mcp_tools import McpTools, ToolServerError

FAKE = [sys.executable, str(ROOT / "tests" / "fake_tool_server.py")]
CALCULATOR = ["vapo-mcp", "tool-server", "calculator"]


def tools(*servers, **options) -> McpTools:
    cfg = ToolsConfig(servers=[{"name": f"s{i}", **s} for i, s in enumerate(servers)], **options)
    return McpTools(cfg, log=lambda m: None).start()


@pytest.mark.parametrize("expr,value", [("37*24", "888"), ("(3+4)*5", "35"), ("7/2", "3.5"), ("-5//2", "-3"),
                                        ("2**10", "1024"), ("1/3", "0.3333333333"), ("2.5*4", "10")])
def test_calculator_computes(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr,why", [("1/0", "division by zero"), ("10**31", "too large"), ("2**1000", "exponent"),
                                      ("__import__('os')", "not Call"), ("a+1", "not Name"), ("9" * 201, "longer"),
                                      ("+".join(["1"] * 40), "more than 64 parts"), ("1 +", "not an arithmetic"),
                                      ("", "empty"), ("(1).real", "not Attribute"), ("1e308*1e308", "out of range")])
def test_calculator_refuses_with_a_reason(expr, why):
    with pytest.raises(CalcError, match=why):
        calculate(expr)


def test_calculator_over_stdio_lists_and_calls():
    box = tools({"command": CALCULATOR})
    try:
        (spec,) = box.specs()
        assert spec["function"]["name"] == "calculate" and "expression" in spec["function"]["parameters"]["required"]
        assert box.call("calculate", {"expression": "37*24"}).text == "888"
        bad = box.call("calculate", {"expression": "1/0"})
        assert not bad.ok and "division by zero" in bad.text
        assert not box.call("calculate", {"x": 1}).ok and not box.call("nope", {}).ok  # observations, no raise
    finally:
        box.close()


def test_a_hanging_call_times_out_and_the_server_stays():
    box = tools({"command": [*FAKE, "hang"]}, call_timeout_s=1)
    try:
        t = time.monotonic()
        results = box.call_many([("lookup", {"query": q}) for q in "abcdef"])  # one turn of six episodes
        assert all(not r.ok and "did not answer within 1 s" in r.text for r in results)
        assert time.monotonic() - t < 8  # together: one timeout for the turn, not six
        assert box.restarts == 0  # it still answers tools/list: kept
    finally:
        box.close()


def test_a_crash_mid_run_is_an_error_and_the_server_restarts(tmp_path):
    box = tools({"command": [*FAKE, "crash"]}, max_restarts=1)
    try:
        assert box.call("lookup", {"query": "a"}).text == "a=42"
        crashed = box.call("lookup", {"query": "crash"})
        assert not crashed.ok and crashed.text.startswith("error:")
        assert box.call("lookup", {"query": "b"}).text == "b=42" and box.restarts == 1  # a new process
        assert not box.call("lookup", {"query": "crash"}).ok
        gone = box.call("lookup", {"query": "c"})  # the restart budget is spent: unavailable, still no raise
        assert not gone.ok and "unavailable" in gone.text and "max_restarts" in gone.text
    finally:
        box.close()


def test_a_10_mb_answer_is_cut():
    box = tools({"command": [*FAKE, "big"]}, max_result_chars=100)
    try:
        r = box.call("lookup", {"query": "a"})
        assert not r.ok and r.text.startswith("x" * 100) and "[cut: 9999900 more characters]" in r.text
        assert len(r.text) < 200
    finally:
        box.close()


def test_invalid_json_from_the_server_is_a_timeout_and_the_next_call_works():
    box = tools({"command": [*FAKE, "badjson"]}, call_timeout_s=1)
    try:
        assert not box.call("lookup", {"query": "a"}).ok
        assert box.call("lookup", {"query": "b"}).text == "b=42"
    finally:
        box.close()


@pytest.mark.parametrize("command,reason", [
    (["no-such-tool-server-xyz"], "not an executable file and not on PATH"),
    ([sys.executable, "-c", "import sys; sys.exit(1)"], "Connection closed"),
])
def test_a_server_that_cannot_start_refuses_with_one_line(command, reason):
    with pytest.raises(ToolServerError) as e:
        tools({"command": command}, start_timeout_s=20)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rollout.tools.servers[0] (s0): cannot start") and reason in msg
    assert "Fix:" in msg


def test_a_run_whose_server_is_not_on_path_refuses_at_start(tmp_path, model_dir):
    from tests.engine_helpers import make_run
    from vapo_engine.trainer.loop import train
    run = make_run(tmp_path, model_dir, ['rollout.episode="tool_calls"',
                                         'rollout.tools.servers=[{name="calc", command=["no-such-tool-server-xyz"]}]'])
    with pytest.raises(ToolServerError, match=r"servers\[0\] \(calc\): cannot start 'no-such-tool-server-xyz'"):
        train(run, log=lambda m: None)
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_calculator_over_streamable_http():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "tool-server", "calculator", "--http", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        box = tools({"url": f"http://127.0.0.1:{port}/mcp"})
        try:
            assert box.call("calculate", {"expression": "12*12"}).text == "144"
        finally:
            box.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_doctor_and_start_training_refuse_a_server_not_on_path(project, tmp_path):
    """The preflight finds it before any run is queued: start_training (CLI caller) refuses with the finding."""
    from tools.paths import Files, ToolInputError
    from tools.training import start_training
    from vapo_engine.doctor import run_doctor
    bad = ['rollout.episode="tool_calls"', 'rollout.tools.servers=[{name="x", command=["no-such-tool-server-xyz"]}]']
    report = run_doctor(project / "config.toml", preset="cpu-demo", overrides=bad, log_dir=tmp_path / "logs")
    (finding,) = [f for f in report.findings if f.check == "tools"]
    assert finding.severity == "error" and "rollout.tools.servers[0] (x): 'no-such-tool-server-xyz'" in finding.what
    with pytest.raises(ToolInputError, match="no-such-tool-server-xyz"):
        start_training(Files(project / "config.toml", project / "settings.json"), preset="cpu-demo", overrides=bad)
