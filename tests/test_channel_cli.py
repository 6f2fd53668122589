"""`vapo-mcp check | smoke | diagnose` end to end (in-process `main`), against the fake server."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import CANARY, FakeOpenAI, Reply

from server.cli import main

CHAT = "POST /v1/chat/completions"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake():
    with FakeOpenAI(key=CANARY) as srv:
        yield srv


@pytest.fixture
def files(tmp_path, fake, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "TAOTOKEN_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLI_TEST_KEY", CANARY)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"api": {"base_url": fake.base_url, "api_key_env": "CLI_TEST_KEY"},
                                    "models": {"reasoning": "qwen-32b", "fallback": "qwen-14b"},
                                    "runtime": {"stream": True}}))
    config = tmp_path / "config.toml"
    config.write_text(f'[api]\nbase_url = "{fake.base_url}"\napi_key_env = "CLI_TEST_KEY"\n'
                      "timeout_seconds = 5\nmax_retries = 1\n")
    return ["--settings", str(settings), "--config", str(config)]


def run_cli(capsys, caplog, *argv) -> tuple[int, str, str]:
    caplog.set_level(logging.DEBUG)
    code = main(list(argv))
    out, err = capsys.readouterr()
    for text in (out, err, caplog.text):
        assert CANARY not in text
    return code, out, err


def test_check_ok_text_and_json(fake, files, capsys, caplog):
    code, out, _ = run_cli(capsys, caplog, "check", *files)
    assert code == 0 and "OK: channel OK" in out and "sk-…" in out and "GET /models" in out
    code, out, _ = run_cli(capsys, caplog, "check", *files, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["http_code"] == "200" and data["auth_enforced"] is True


def test_check_failure_exit_1(fake, files, capsys, caplog, monkeypatch):
    monkeypatch.setenv("CLI_TEST_KEY", "CLI_TEST_KEY")
    code, out, _ = run_cli(capsys, caplog, "check", *files)
    assert code == 1 and "FAILED" in out and "http-401-env-name-as-key" in out and "fix:" in out


def test_check_bad_settings_is_a_user_error(tmp_path, capsys, caplog):
    bad = tmp_path / "settings.json"
    bad.write_text('{"api": {"base_url": "https://h/v1", "api_key_env": "K"}, "modelz": {}}')
    code, _out, err = run_cli(capsys, caplog, "check", "--settings", str(bad), "--config", str(tmp_path / "c.toml"))
    assert code == 2 and "modelz" in err and "Traceback" not in err


def test_smoke_pass_and_fail(fake, files, capsys, caplog):
    code, out, _ = run_cli(capsys, caplog, "smoke", *files)
    assert code == 0 and "PASS" in out and "streamed" in out
    fake.script(CHAT, Reply.ok("It is 60 km/h."))
    code, out, _ = run_cli(capsys, caplog, "smoke", *files, "--no-stream", "--json")
    data = json.loads(out)
    assert code == 1 and not data["passed"] and "wrong answer" in data["reason"] and data["streamed"] is False


def test_smoke_options(fake, files, capsys, caplog):
    fake.answers["qwen-14b"] = "Paris"
    code, out, _ = run_cli(capsys, caplog, "smoke", *files, "--prompt", "Capital of France?", "--expect", "Paris",
                           "--model", "qwen-14b", "--max-tokens", "16", "--json")
    data = json.loads(out)
    assert code == 0 and data["model_used"] == "qwen-14b" and fake.requests[-1].json["max_tokens"] == 16
    code, _, err = run_cli(capsys, caplog, "smoke", *files, "--max-tokens", "0")
    assert code == 2 and "max-tokens" in err


def test_diagnose_text_json_and_files(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./settings.json: only the given evidence counts
    body = tmp_path / "body.json"
    body.write_text('{"error": {"message": "Rate limit reached for requests"}}')
    code, out, _ = run_cli(capsys, caplog, "diagnose", "--status", "429", "--body", f"@{body}",
                           "--header", "retry-after: 7")
    assert code == 0 and "http-429-rate-limit" in out and "7s" in out
    code, out, _ = run_cli(capsys, caplog, "diagnose", "--status", "401", "--json",
                           "--body", f'{{"error": {{"message": "bad key {CANARY}"}}}}')
    assert code == 0 and json.loads(out)["findings"][0]["rule_id"] == "http-401-key-rejected"
    log = tmp_path / "app.log"
    log.write_text("httpx.ConnectError: [Errno -2] Name or service not known")
    code, out, _ = run_cli(capsys, caplog, "diagnose", "--log", str(log), "--code", str(tmp_path))
    assert code == 0 and "net-dns" in out


@pytest.mark.parametrize("argv, message", [
    (["diagnose", "--status", "999"], "not an HTTP status"),
    (["diagnose", "--body", "@/nonexistent/body.json"], "cannot read"),
    (["diagnose", "--header", "nocolon"], "Name: value"),
    (["diagnose", "--log", "/nonexistent.log"], "not found"),
])
def test_diagnose_user_errors(argv, message, capsys, caplog):
    code, _, err = run_cli(capsys, caplog, *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_cli_entry_point_subprocess(fake, files, tmp_path):
    """The real executable path: a fresh interpreter, stdout/stderr captured, the key nowhere."""
    env = {"CLI_TEST_KEY": CANARY, "PATH": "/usr/bin:/bin", "NO_PROXY": "*"}
    proc = subprocess.run([sys.executable, "-m", "server.cli", "check", *files, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "ok"
    assert CANARY not in proc.stdout + proc.stderr


def test_key_pasted_into_settings_is_never_echoed(tmp_path, capsys, caplog):
    bad = tmp_path / "settings.json"
    bad.write_text(json.dumps({"api": {"base_url": "https://h/v1", "api_key_env": CANARY}}))
    code, _, err = run_cli(capsys, caplog, "check", "--settings", str(bad), "--config", str(tmp_path / "c.toml"))
    assert code == 2 and "api.api_key_env" in err
    code, out, _ = run_cli(capsys, caplog, "diagnose", "--settings", str(bad), "--json")
    assert code == 0 and "config-key-in-settings" in out
