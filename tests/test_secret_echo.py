"""A hostile OpenAI-compatible server on 127.0.0.1 echoes the key everywhere it can (headers, reason phrase,
model ids, the `model` of completions, answer and reasoning text, SSE chunks, 401/404/429/500 error bodies):
no trace of it — whole, partial, upper-cased or base64 — may reach a `check_channel` / `smoke_test` result, the
output of `vapo-mcp check|smoke [--json]`, a log record (DEBUG, httpx/httpcore included) or a file."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, fast_policy, key_traces, make_channel, sse_events

from server.cli import main
from tools.channel import check_channel_sync, smoke_test_sync
from vapo_engine.config import redact

PLAIN_KEY = "4lpdSukDf984vWQeepvPy2z2WWAYDwm90sdP3FfD"
"""A random 40-character key with no well-known prefix."""
SK_KEY = "sk-zk9a0x86YsqZrefeHIFkO98YBDCHIcmarebYeG1aT3lWl8vk"
CHAT, MODELS = "POST /v1/chat/completions", "GET /v1/models"


@pytest.fixture(params=[PLAIN_KEY, SK_KEY], ids=["no-prefix", "sk"])
def key(request) -> str:
    return request.param


@pytest.fixture
def echo(key, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "TAOTOKEN_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI(key=key, echo=True) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _logs(caplog):
    caplog.set_level(logging.DEBUG)


def assert_no_trace(text: str, key: str) -> None:
    assert not key_traces(text, key), f"the key leaked: {key_traces(text, key)[:3]}"


def assert_logs_clean(caplog, key: str) -> None:
    """No trace in any record; and the key did reach the logs (httpcore logs the echoed response headers at
    DEBUG, httpx the reason phrase at INFO), only redacted."""
    text = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert redact(key) in text
    assert_no_trace(text, key)


def test_check_channel_ok_path_leaves_no_trace(echo, key, caplog):
    report = check_channel_sync(make_channel(echo.base_url, key), policy=fast_policy(), env={})
    assert report.ok and report.models_count == 4
    assert redact(key) in report.models_sample and redact(key) in report.rate_limit_headers.values()
    assert_no_trace(report.model_dump_json(), key)
    assert_logs_clean(caplog, key)


def test_check_channel_errors_echoing_the_key_leave_no_trace(echo, key, caplog):
    echo.script(MODELS, Reply.error(500, f"models backend failed for {key}", headers={"retry-after-ms": "5"}))
    echo.script(CHAT, Reply.error(429, f"Rate limit reached for key {key[:24]}", headers={"retry-after-ms": "5"}),
                Reply.error(500, f"upstream rejected {key}", code=key, type_=f"err_{key}"),
                Reply(502, body=f"<html><title>502 Bad Gateway {key}</title></html>"),
                Reply.error(404, f"The model `qwen-14b` does not exist for key {key}", "model_not_found"))
    report = check_channel_sync(make_channel(echo.base_url, key), policy=fast_policy(), env={})
    assert not report.ok and [p.http_code for p in report.probes][-2:] == ["502", "404"]
    assert report.probes[0].ok and report.probes[0].attempts == 2
    assert_no_trace(report.model_dump_json(), key)
    assert_logs_clean(caplog, key)


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_smoke_test_answer_and_reasoning_leave_no_trace(echo, key, stream, caplog):
    result = smoke_test_sync(make_channel(echo.base_url, key, stream=stream), policy=fast_policy(), env={})
    assert result.passed and result.streamed is stream
    assert redact(key) in result.answer_excerpt and redact(key) in result.reasoning_excerpt
    assert_no_trace(result.model_dump_json(), key)
    assert_logs_clean(caplog, key)


def test_smoke_failures_echoing_the_key_leave_no_trace(echo, key, caplog):
    echo.script(CHAT, Reply.error(401, f"Incorrect API key provided: {key}. Received API Key = {key[:-6]}",
                                  code="invalid_api_key", type_=key))
    failed = smoke_test_sync(make_channel(echo.base_url, key), policy=fast_policy(), env={})
    assert not failed.passed and failed.http_code == "401"
    broken = sse_events(f"Partial answer for {key} …", "qwen-32b", pieces=2)
    echo.script(CHAT, *[Reply(sse=broken, break_after=2) for _ in range(3)])
    cut = smoke_test_sync(make_channel(echo.base_url, key, stream=True, fallback_model=None),
                          policy=fast_policy(), env={})
    assert not cut.passed and cut.error["kind"] == "stream_broken"
    echo.script(CHAT, Reply(sse=[{"error": {"message": f"upstream says {key}", "code": key}}]))
    event = smoke_test_sync(make_channel(echo.base_url, key, stream=True), policy=fast_policy(), env={})
    assert not event.passed and event.error["kind"] == "stream_error"
    for result in (failed, cut, event):
        assert_no_trace(result.model_dump_json(), key)
    assert_logs_clean(caplog, key)


@pytest.fixture
def project(tmp_path, echo, key, monkeypatch):
    """settings.json + config.toml pointing at the echo server, the key in the environment, cwd = tmp_path."""
    monkeypatch.setenv("ECHO_TEST_KEY", key)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings.json").write_text(json.dumps({
        "api": {"base_url": echo.base_url, "api_key_env": "ECHO_TEST_KEY"},
        "models": {"reasoning": "qwen-32b", "fallback": "qwen-14b"}, "runtime": {"stream": True}}))
    (tmp_path / "config.toml").write_text(f'[api]\nbase_url = "{echo.base_url}"\napi_key_env = "ECHO_TEST_KEY"\n'
                                          "timeout_seconds = 5\nmax_retries = 1\n")
    return tmp_path


def files_text(root: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file())


def test_cli_check_and_smoke_leave_no_trace(project, echo, key, capsys, caplog):
    argv = ["--settings", "settings.json", "--config", "config.toml"]
    echo.script(CHAT, Reply.error(404, f"The model `qwen-32b` is unknown to key {key}", "model_not_found"))
    outputs = []
    for cmd in (["check"], ["check", "--json"], ["smoke"], ["smoke", "--json"], ["smoke", "--no-stream"]):
        code = main([*cmd, *argv])
        out, err = capsys.readouterr()
        assert code in (0, 1) and "Traceback" not in err, (cmd, err)
        outputs.append(out + err)
    assert "NOT listed" not in outputs[0] and redact(key) in outputs[0]
    assert json.loads(outputs[1])["ok"] and json.loads(outputs[3])["passed"]
    assert "PASS" in outputs[2] and redact(key) in outputs[4]
    for text in outputs:
        assert_no_trace(text, key)
    assert_logs_clean(caplog, key)
    assert_no_trace(files_text(project), key)
