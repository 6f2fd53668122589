"""Bad input gets a clear error and runs nothing (docs/security.md "What holds for every caller"), each reproduction as it was found: a
model folder whose config names an unknown `model_type` and an `auto_map`, served with stdin offering "y"
(transformers used to ask `[y/N]` and then run the folder's code); a key pasted as `diagnose_error`'s
code_path (echoed unscrubbed); NUL in path-valued config keys over MCP (a bare "Error executing tool"); NaN,
inf, deep JSON and a lone surrogate sent to serve-model (500 and a traceback, the deep JSON also dropped the
connection)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import anyio
import httpx
import pytest

from tests.conftest import ROOT
from tests.fake_openai import closed_port
from tests.mcp_helpers import text
from tests.serving_helpers import serving

KEY = "sk-canary-9Qx7Lm2Pz8Rt4Vw6Yb3NcK5Jd"
EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('the folder code ran')\n"
"""The folder's code: it marks that it ran (transformers imports a copy from its modules cache, so the marker
path is absolute)."""


# --- trust_remote_code ---------------------------------------------------------------------------------------
def _remote_code_folder(folder):
    folder.mkdir()
    auto = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
            "AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "config.json").write_text(json.dumps({"model_type": "vapo_evil_arch", "auto_map": auto,
                                                    "architectures": ["EvilModel"]}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "EvilTokenizer",
                                                              "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer",
                                                                                             None]}}))
    (folder / "evil.py").write_text(EVIL.format(marker=str(folder / "RAN")))
    return folder


@pytest.mark.timeout(600)
def test_serve_model_never_runs_a_folders_code_even_when_stdin_says_yes(tmp_path):
    folder = _remote_code_folder(tmp_path / "evil")
    r = subprocess.run([sys.executable, "-m", "server.cli", "serve-model", str(folder), "--port",
                        str(closed_port())], input="y\n" * 10, capture_output=True, text=True, timeout=500,
                       cwd=ROOT, check=False)
    assert not (folder / "RAN").exists(), "the model folder's own code ran"
    assert r.returncode != 0
    assert "model_type 'vapo_evil_arch'" in r.stderr and "never run" in r.stderr, r.stderr[-2000:]
    assert "[y/N]" not in r.stdout + r.stderr


def test_every_loader_refuses_a_folder_that_only_its_own_code_could_load(tmp_path):
    from vapo_engine.rollout.tokenizer import RemoteCodeRefused, load_tokenizer, refuse_remote_code
    folder = _remote_code_folder(tmp_path / "evil")
    for load in (refuse_remote_code, load_tokenizer):
        with pytest.raises(RemoteCodeRefused, match="auto_map"):
            load(folder)
    assert not (folder / "RAN").exists()


def test_trust_remote_code_is_passed_explicitly_wherever_weights_or_configs_load():
    for path in ("vapo_engine/rollout/tokenizer.py", "vapo_engine/trainer/models.py", "vapo_engine/serving/model.py",
                 "vapo_engine/builtin_model/build.py"):
        lines = (ROOT / path).read_text().splitlines()
        for i, line in enumerate(lines):
            if ".from_pretrained(" in line and not line.lstrip().startswith(("#", "`")) and "`" not in line:
                call = " ".join(lines[i:i + 2])
                assert "NO_REMOTE_CODE" in call or "trust_remote_code=False" in call, f"{path}:{i + 1}: {line}"


# --- a key-shaped code_path is scrubbed wherever it is echoed ------------------------------------------------
def test_a_key_passed_as_code_path_is_never_echoed(proj, capsys):
    from mcp import Client

    from server.app import build_server
    from server.cli import main
    path = str(proj / KEY)

    async def call():
        async with Client(build_server()) as c:
            return await c.call_tool("diagnose_error", {"code_path": path})
    res = anyio.run(call)
    assert KEY not in text(res) and "code path not found" in text(res), text(res)[:1000]
    main(["diagnose", "--code", path, "--config", str(proj / "config.toml"), "--settings",
          str(proj / "settings.json")])
    out = capsys.readouterr()
    assert KEY not in out.out + out.err and "code path not found" in out.out + out.err


def test_a_refused_remote_path_is_scrubbed_too(tmp_path):
    from tools.access import refusal
    assert KEY not in str(refusal(f"/elsewhere/{KEY}"))


# --- NUL in paths ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["model.local_path", "model.value_path", "data.data_dir"])
def test_nul_in_a_path_is_a_clear_error_over_mcp(proj, key):
    from mcp import Client

    from server.app import build_server

    async def call():
        async with Client(build_server()) as c:
            return [await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": [over]})
                    for over in (f'{key}="/tmp/a\\u0000b"', f"{key}=/tmp/a\x00b")]
    for res in anyio.run(call):
        assert res.is_error and not re.fullmatch(r"Error executing tool \w+", text(res).strip()), text(res)
        assert key in text(res) and "control character" in text(res), text(res)
    assert not list((proj / "logs").glob("*/*")) if (proj / "logs").exists() else True


def test_nul_in_diagnose_paths_is_a_clear_error():
    from tools.diagnose import diagnose_error
    from tools.paths import ToolInputError
    for name in ("code_path", "log_path"):
        with pytest.raises(ToolInputError, match=f"{name} contains a NUL"):
            diagnose_error(**{name: "/tmp/a\x00b"})


# --- serve-model: 400, OpenAI-shaped, and the connection still serves ---------------------------------------
@pytest.fixture(scope="module")
def served(model_dir):
    with serving(model_dir, model_name="tiny") as s:
        yield s


BAD_BODIES = {
    "NaN temperature": b'{"model": "tiny", "messages": [{"role": "user", "content": "1+1="}], "temperature": NaN}',
    "Infinity top_p": b'{"model": "tiny", "messages": [{"role": "user", "content": "1+1="}], "top_p": -Infinity}',
    "1e999 temperature": b'{"model": "tiny", "messages": [{"role": "user", "content": "1+1="}], "temperature": 1e999}',
    "deep JSON": b"[" * 200_000 + b"]" * 200_000,
    "deep JSON in a field": b'{"model": "tiny", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "lone surrogate": b'{"model": "tiny", "messages": [{"role": "user", "content": "1+1=\\ud800"}]}',
    "lone surrogate key": b'{"model": "tiny", "\\udfff": 1, "messages": [{"role": "user", "content": "x"}]}',
}


@pytest.mark.parametrize("what", list(BAD_BODIES))
def test_serve_model_answers_bad_json_with_a_400_and_keeps_the_connection(served, what):
    with httpx.Client(timeout=60) as http:
        r = http.post(served.url + "/chat/completions", content=BAD_BODIES[what],
                      headers={"content-type": "application/json"})
        assert r.status_code == 400, (what, r.status_code, r.text[:500])
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert "Traceback" not in r.text
        ok = http.post(served.url + "/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": "1+1="}]})
        assert ok.status_code == 200, ok.text[:300]
        assert r.headers.get("connection", "").lower() != "close"


# --- every finding fully rendered --------------------------------------------------------------------------------
def test_every_rule_renders_without_a_placeholder_on_empty_facts():
    import string

    from vapo_engine.diagnostics import Evidence
    from vapo_engine.diagnostics.engine import render
    from vapo_engine.diagnostics.rules import load_rules
    empty = Evidence()
    for rule in load_rules():
        for template in (rule.title, rule.cause, rule.evidence, rule.fix):
            names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
            for full in (None, empty):
                out = render(template, empty, full)
                assert not any(f"<{n}>" in out or f"{{{n}}}" in out for n in names), (rule.id, out)


def test_a_model_without_a_close_match_gets_a_plain_fix():
    from vapo_engine.diagnostics import Evidence
    from vapo_engine.diagnostics.engine import render
    ev = Evidence(model="qwen-32b", models_listed=["tiny"])
    assert render("close matches: {close_matches}", ev) == "close matches: none; pick one GET /models lists"


# --- MCP over HTTP behind a reverse proxy on a default port ------------------------------------------------------
def test_a_host_header_without_a_port_is_accepted_when_the_name_is_allowed():
    from mcp.server.transport_security import TransportSecurityMiddleware

    from server.http import security_settings
    guard = TransportSecurityMiddleware(security_settings("127.0.0.1", ["gpu-box.internal"]))
    for ok in ("gpu-box.internal", "gpu-box.internal:8765", "localhost", "127.0.0.1:80", "[::1]"):
        assert guard._validate_host(ok), ok
    for bad in ("evil.example", "evil.example:80", "gpu-box.internal.evil.example", "gpu-box.internalx"):
        assert not guard._validate_host(bad), bad
    assert guard._validate_origin("https://gpu-box.internal") and not guard._validate_origin("https://evil.example")


def test_prose_after_bearer_is_not_redacted_but_a_token_is():
    from vapo_engine.providers import scrub
    from vapo_engine.serving.security import check_bind
    try:
        check_bind("0.0.0.0", None)
    except Exception as e:  # noqa: BLE001 - the UserError the CLI prints (scrubbed)
        shown = scrub(str(e))
    assert "without a bearer token: export VAPO_MCP_TOKEN=" in shown, shown
    assert "abc123def456ghi" not in scrub("Authorization: Bearer abc123def456ghi")
    assert "abcdefghijklmnopqrstuvwxyz" not in scrub("Bearer abcdefghijklmnopqrstuvwxyz")


def test_http_sessions_expire_and_are_bounded():
    from server.app import build_server
    from server.http import MAX_SESSIONS, SESSION_IDLE_S, http_app
    from tests.mcp_helpers import HTTP_TOKEN
    server = build_server()
    http_app(server, host="127.0.0.1", token=HTTP_TOKEN)
    assert server.session_manager.session_idle_timeout == SESSION_IDLE_S <= 600
    assert server.session_manager.max_sessions == MAX_SESSIONS <= 1000
