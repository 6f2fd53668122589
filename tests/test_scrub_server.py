"""A provider that answers a megabyte of key-shaped text cannot stall the MCP server (docs/security.md "What holds for every caller"): a real
`vapo-mcp serve --http` process runs smoke_test against a loopback provider whose answer is
`"sk-" * 350000`; while the answer is scrubbed, /health keeps answering (median under 100 ms, none over 1 s; before, the scrub ran on
the event loop: 47.6 s for 60 kB, /health blocked throughout), and nothing of the key reaches the result."""
from __future__ import annotations

import os
import threading
import time

import anyio
import httpx
import pytest

from tests.fake_openai import CANARY, FakeOpenAI, Reply, closed_port
from tests.mcp_helpers import call_http, serve_http, text

CHAT = "POST /v1/chat/completions"


@pytest.mark.timeout(300)
def test_health_answers_while_a_megabyte_answer_is_scrubbed(proj, monkeypatch):
    answer = "80 km/h. " + "sk-" * 350_000 + CANARY
    with FakeOpenAI(key=CANARY) as fake:
        fake.script(CHAT, Reply.ok(answer))
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        port = closed_port()
        proc = serve_http(proj, port)
        try:
            result, latencies = {}, []
            call = threading.Thread(target=lambda: result.update(
                res=anyio.run(call_http, port, "smoke_test", {})), daemon=True)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                idle = _poll(http, 2.0)  # the machine's own latency, for the failure message
                call.start()
                while call.is_alive() and len(latencies) < 5000:
                    t = time.perf_counter()
                    assert http.get("/health").status_code == 200
                    latencies.append(time.perf_counter() - t)
                    time.sleep(0.02)
            call.join(timeout=240)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        assert fake.count(CHAT) == 1
    res = result["res"]
    assert not res.is_error and res.structured_content["passed"], text(res)[:500]
    assert CANARY not in text(res)
    assert len(latencies) >= 10, "the call ended before /health was polled: the test proves nothing"
    latencies.sort()
    # The old code blocked /health for the whole scrub (46 s for 60 kB). On a quiet machine every poll answers
    # in well under 100 ms; a loaded CI machine can delay a single poll, so one late answer is tolerated up to
    # 1 s, while the median must stay under 100 ms.
    median, worst = latencies[len(latencies) // 2], latencies[-1]
    detail = (f"median {median * 1000:.0f} ms, worst {worst * 1000:.0f} ms; with no scrub running: max "
              f"{max(idle) * 1000:.0f} ms, load average {os.getloadavg()[0]:.1f}")
    assert median < 0.1, f"/health was slow while the scrub ran: {detail}"
    assert worst < 1.0, f"/health was blocked while the scrub ran: {detail}"


def _poll(http: httpx.Client, seconds: float) -> list[float]:
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        assert http.get("/health").status_code == 200
        out.append(time.perf_counter() - t)
        time.sleep(0.02)
    return out
