"""`vapo-mcp serve --http --body-timeout N` (a real server process on 127.0.0.1): a client with the token that
sends its request head and then trickles the body gets 408 after N seconds and its connection is closed; a
client without the token is refused 401 on its headers at once, before any body is read; a body declared over
MAX_BODY gets 413; a whole request in time is served as before."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

from server.http import MAX_BODY
from tests.fake_openai import closed_port, read_until_closed
from tests.mcp_helpers import HTTP_TOKEN as TOKEN
from tests.mcp_helpers import serve_http

INIT = (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
        b'"capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}')


def _head(port: int, length: int, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\n" + auth + f"Content-Length: {length}\r\n\r\n".encode())



def test_a_trickled_body_gets_408_and_the_token_is_checked_before_the_body(proj):
    port = closed_port()
    proc = serve_http(proj, port, "--body-timeout", "1")
    try:
        # with the token: half the body, then nothing more; 408 after ~1 s and the server closes the connection
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            t0 = time.monotonic()
            s.sendall(_head(port, len(INIT), TOKEN) + INIT[:20])
            answer = read_until_closed(s)
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"request_timeout" in answer and b"within 1 s" in answer and b"--body-timeout" in answer, answer
        assert 0.8 < took < 10, took
        # without the token: 401 on the headers alone, long before the body timeout
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            t0 = time.monotonic()
            s.sendall(_head(port, len(INIT), None) + INIT[:20])
            first = s.recv(65536)
            assert time.monotonic() - t0 < 0.9 and first.startswith(b"HTTP/1.1 401"), first[:300]
        # a body declared larger than MAX_BODY: 413 without reading it
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(_head(port, MAX_BODY + 1, TOKEN))
            answer = read_until_closed(s)
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer, answer[:300]
        # a request sent whole is served
        r = httpx.post(f"http://127.0.0.1:{port}/mcp", content=INIT, timeout=20, headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"})
        assert r.status_code == 200 and "vapo-mcp" in r.text, r.text
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1]
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err


def test_body_timeout_is_a_checked_option():
    r = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--http", "--body-timeout", "0"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2 and "--body-timeout" in r.stderr and "out of range 1..3600" in r.stderr, r.stderr
    help_text = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--help"], capture_output=True,
                               text=True, timeout=30, check=False).stdout
    assert "--body-timeout" in help_text and "408" in help_text
