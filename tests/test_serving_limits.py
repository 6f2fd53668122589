"""How much of `serve-model` slow clients or a crowd can hold (vapo_engine/serving/limits.py), on a real
uvicorn server on 127.0.0.1: a body that trickles in gets 408 and its connection is closed; requests beyond
--max-concurrent get an OpenAI-shaped 503 with Retry-After while /health still answers."""
from __future__ import annotations

import socket
import time

import httpx

from tests.fake_openai import read_until_closed
from tests.serving_helpers import serving


def _slow_post(root: str) -> socket.socket:
    """A chat request whose head is complete and whose body is sent only in part (a slow client)."""
    host, port = root.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 200\r\n\r\n{\"model\": ")
    return s



def test_slow_bodies_time_out_and_a_crowd_gets_503(model_dir):
    with serving(model_dir, model_name="tiny", max_concurrent=2, body_timeout_s=2) as srv:
        t0 = time.monotonic()
        slow = [_slow_post(srv.root) for _ in range(2)]
        deadline = time.monotonic() + 10
        while (r := httpx.get(srv.url + "/models", timeout=10)).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both slow requests are in progress
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["code"] == "server_busy" and "--max-concurrent" in err["message"] and "2 requests" in err["message"]
        assert httpx.get(srv.root + "/health", timeout=10).status_code == 200  # never refused
        for s in slow:
            with s:
                answer = read_until_closed(s)  # the server closes the connection after the 408
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b"request_timeout" in answer and b"within 2 s" in answer
        assert 1.5 < time.monotonic() - t0 < 20
        ok = httpx.post(srv.url + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2})
        assert ok.status_code == 200, ok.text  # the slots are free again


def test_the_options_and_their_defaults():
    import argparse

    import pytest

    from vapo_engine.serving.limits import BODY_TIMEOUT_S, MAX_CONCURRENT
    from vapo_engine.serving.options import add_arguments, options_from
    p = argparse.ArgumentParser()
    add_arguments(p, target_help="x")
    opts = options_from(p.parse_args(["d"]), "d")
    assert (opts.max_concurrent, opts.body_timeout_s) == (MAX_CONCURRENT, BODY_TIMEOUT_S)
    opts = options_from(p.parse_args(["d", "--max-concurrent", "3", "--body-timeout", "5"]), "d")
    assert (opts.max_concurrent, opts.body_timeout_s) == (3, 5.0)
    with pytest.raises(SystemExit):
        p.parse_args(["d", "--max-concurrent", "0"])
