"""HTTP mode at its edges, against a real uvicorn server on 127.0.0.1: any Authorization header that is not the
token (non-ASCII bytes, a token with a suffix, no scheme) gets 401 and leaves no traceback in the log; a token
shorter than 16 characters is refused for every bind, with how to generate a good one; `vapo-mcp serve --http
--allow-path DIR` confines an MCP client's paths to the project and DIR, end to end."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from contextlib import contextmanager

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fake_openai import closed_port
from tests.mcp_helpers import HTTP_TOKEN as TOKEN
from tests.mcp_helpers import serve_http, text, uvicorn_in_thread

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@contextmanager
def serving(app):
    """`app` on a real uvicorn server in a thread; its log records propagate to pytest's caplog."""
    with uvicorn_in_thread(app, log_config=None, log_level="info") as port:
        yield f"http://127.0.0.1:{port}"


def test_any_wrong_authorization_header_gets_401_and_no_traceback(proj, caplog):
    from server.app import build_server
    from server.http import http_app
    caplog.set_level(logging.INFO)
    bad = [b"Bearer \xc3\xa9t\xc3\xa9", b"Bearer \xff\xfe\x80", ("Bearer " + TOKEN).encode() + b"\xc3\xa9",
           b"Bearer " + "é".encode() * 40, b"\xc3\xa9" + TOKEN.encode(), TOKEN.encode(), b"Bearer"]
    app = http_app(build_server(), host="127.0.0.1", token=TOKEN)
    with serving(app) as base, httpx.Client(base_url=base, timeout=20) as http:
        for value in bad:
            r = http.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": value})
            assert r.status_code == 401, (value, r.status_code, r.text)
        ok = http.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and "vapo-mcp" in ok.text
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    assert "Traceback" not in logged and "Exception in ASGI application" not in logged, logged
    assert not any(r.exc_info for r in caplog.records)


def test_a_short_token_is_refused_for_every_bind(proj):
    from server.app import build_server
    from server.http import MIN_TOKEN_CHARS, http_app
    from vapo_engine.errors import is_user_error
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(Exception) as e:
            http_app(build_server(), host=host, token="x" * (MIN_TOKEN_CHARS - 1))
        assert is_user_error(e.value) and "secrets.token_urlsafe" in str(e.value)
    assert http_app(build_server(), host="0.0.0.0", token="y" * MIN_TOKEN_CHARS) is not None


def test_serve_with_a_one_character_token_exits_2_with_the_fix(proj):
    env = dict(os.environ, VAPO_MCP_TOKEN="z")
    for host in ("127.0.0.1", "0.0.0.0"):
        r = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--http", "--host", host, "--port",
                            str(closed_port())], env=env, capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "at least 16" in r.stderr and "export VAPO_MCP_TOKEN=" in r.stderr and "token_urlsafe" in r.stderr


def test_serve_http_allow_path_confines_a_remote_client_end_to_end(proj, tmp_path):
    shared, other = tmp_path / "shared", tmp_path / "other"
    for folder in (shared, other):
        folder.mkdir()
        (folder / "app.log").write_text("openai.RateLimitError: Error code: 429 - rate limit reached\n")
    port = closed_port()
    proc = serve_http(proj, port, "--allow-path", str(shared))
    try:
        async def calls():
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c:
                ok = await c.call_tool("diagnose_error", {"log_path": str(shared / "app.log"), "check_config": False})
                no = await c.call_tool("diagnose_error", {"log_path": str(other / "app.log"), "check_config": False})
                rdzv = await c.call_tool("start_training", {"preset": "cpu-demo",
                                                            "overrides": ["distributed.nnodes=4"]})
            return ok, no, rdzv
        ok, no, rdzv = anyio.run(calls)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert not ok.is_error and ok.structured_content["findings"], text(ok)
    assert no.is_error and "outside the allowed roots" in text(no) and "--allow-path folders" in text(no), text(no)
    assert str(shared) not in text(no)  # the roots are named by role, never by their paths on the server
    assert rdzv.is_error and "config.toml or the CLI" in text(rdzv)
    r = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--http", "--allow-path", str(tmp_path / "nope")],
                       env=dict(os.environ, VAPO_MCP_TOKEN=TOKEN), capture_output=True, text=True, timeout=30,
                       check=False)
    assert r.returncode == 2 and "--allow-path" in r.stderr and "Traceback" not in r.stderr, r.stderr
