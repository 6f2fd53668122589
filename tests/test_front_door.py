"""The HTTP front door cannot be held shut or fooled (vapo_engine/serving/admission.py, security.py; docs/security.md
"Serving over HTTP"). Reproductions as found:

- 256 connections that connect and send nothing kept every `/health` probe of `vapo-mcp serve --http` at 503 for
  45 s (uvicorn's connection limit counts connections that never authenticated); serve-model had no connection
  cap at all. Now such connections have a small budget of their own (16 per address, 64 in all; the oldest is
  closed to make room), so /health and a client with the token are answered at once.
- `Host: 127.0.0.1:1@evil.com` was accepted by both servers (and such an Origin by the MCP server).
Real servers on loopback: a `vapo-mcp serve --http` process, and serve-model run the way its CLI runs it.
"""
from __future__ import annotations

import socket
import time

import httpx

from bench.perf.attack import closed_by_server
from tests.fake_openai import closed_port
from tests.mcp_helpers import HTTP_TOKEN, serve_http, uvicorn_in_thread
from tests.serving_helpers import serving

HALF_OPEN = 256
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"Authorization": f"Bearer {HTTP_TOKEN}", "Accept": "application/json, text/event-stream"}


def _half_open(port: int) -> list[socket.socket]:
    out = []
    for _ in range(HALF_OPEN):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        out.append(s)
    return out


def _timed(fn) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def test_half_open_connections_cannot_hold_the_mcp_server_shut(proj):
    port = closed_port()
    proc = serve_http(proj, port)
    socks: list[socket.socket] = []
    try:
        socks = _half_open(port)
        time.sleep(0.5)
        for _ in range(5):
            health, took = _timed(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=10))
            assert health.status_code == 200 and took < 2, (health.status_code, took)
        init, took = _timed(lambda: httpx.post(f"http://127.0.0.1:{port}/mcp", json=INIT, headers=MCP_HEADERS,
                                               timeout=10))
        assert init.status_code == 200 and took < 5, (init.status_code, init.text[:200])
        assert closed_by_server(socks) >= HALF_OPEN - 64  # those beyond the pending budget are gone at once
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_model_caps_connections_too(model_dir):
    with serving(model_dir, model_name="tiny") as srv:
        port = int(srv.root.rsplit(":", 1)[1])
        socks = _half_open(port)
        try:
            time.sleep(0.5)
            health, took = _timed(lambda: httpx.get(srv.root + "/health", timeout=10))
            assert health.status_code == 200 and took < 2
            assert httpx.get(srv.url + "/models", timeout=10).status_code == 200
            assert closed_by_server(socks) >= HALF_OPEN - 64
            assert srv.prepared.admission.pending <= 64
        finally:
            for s in socks:
                s.close()


def test_a_host_or_origin_with_userinfo_is_refused_by_both_servers(model_dir, proj):
    from server.app import build_server
    from server.http import http_app
    from tools.access import Policy
    app = http_app(build_server(Policy("http")), host="127.0.0.1", token=HTTP_TOKEN)
    evil = "127.0.0.1:1@evil.com"
    with uvicorn_in_thread(app) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        for extra in ({"Host": evil}, {"Origin": f"http://{evil}"}, {"Host": "127.0.0.1:99999"}):
            r = httpx.post(url, json=INIT, headers={**MCP_HEADERS, **extra}, timeout=10)
            assert r.status_code == 421 and "allowed-host" in r.text, (extra, r.status_code)
        assert httpx.post(url, json=INIT, headers=MCP_HEADERS, timeout=10).status_code == 200
    with serving(model_dir, model_name="tiny") as srv:
        r = httpx.get(srv.url + "/models", headers={"Host": evil}, timeout=10)
        assert r.status_code == 421 and r.json()["error"]["code"] == "invalid_host"
        assert httpx.get(srv.url + "/models", timeout=10).status_code == 200
