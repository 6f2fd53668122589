"""A client that connects and never finishes its request headers is disconnected (docs/security.md "Serving over HTTP": 400 such
connections used to be held for as long as the clients kept them open). A real uvicorn server on 127.0.0.1
runs the MCP server's HTTP app with the project's protocol class and a 0.5 s header timeout."""
from __future__ import annotations

import socket
import time

import anyio
import httpx
import pytest

from server.app import build_server
from server.http import http_app
from tests.mcp_helpers import uvicorn_in_thread
from vapo_engine.serving.header_timeout import protocol

TIMEOUT = 0.5
CONFIG = {"log_level": "warning", "timeout_keep_alive": 30, "http": protocol(TIMEOUT)}


async def _slow(scope, receive, send):
    """Answers after 3 header timeouts: a long tool call or a streamed answer must not be cut."""
    if scope["type"] != "http":
        return
    await anyio.sleep(TIMEOUT * 3)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"done"})


@pytest.fixture
def port(proj):
    with uvicorn_in_thread(http_app(build_server(), host="127.0.0.1", token=None), **CONFIG) as port:
        yield port


@pytest.fixture
def slow_port():
    with uvicorn_in_thread(_slow, **CONFIG) as port:
        yield port


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (recv returns b""), or None if it stayed open."""
    sock.settimeout(seconds)
    t = time.perf_counter()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    return time.perf_counter() - t


def test_a_connection_that_sends_no_request_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        assert _closed_within(s, 5) is not None


def test_headers_trickled_past_the_timeout_are_cut(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
        assert _closed_within(s, 5) is not None


def test_a_kept_alive_connection_gets_the_timeout_again_after_a_response(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\n")  # keep-alive is 30 s here: only the header timeout can cut it
        assert _closed_within(s, 5) is not None


def test_requests_with_idle_gaps_longer_than_the_timeout_are_answered(port):
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        for _ in range(3):
            assert http.get("/health").status_code == 200
            time.sleep(TIMEOUT * 1.5)  # idle longer than the header timeout between requests: a new connection
        assert http.get("/health").status_code == 200


def test_a_response_slower_than_the_timeout_is_delivered(slow_port):
    with httpx.Client(base_url=f"http://127.0.0.1:{slow_port}", timeout=10) as http:
        for _ in range(2):  # the first request, then one on the kept-alive connection
            r = http.get("/")
            assert r.status_code == 200 and r.text == "done"
