"""ProviderWorker against a real OpenAI-compatible server on 127.0.0.1: a 429 storm with Retry-After (no stall,
the limit cut and restored, every sample accounted for), a 401 (provider down with the channel's fix, submit
never blocks), a full queue (non-blocking, counted), latency and token accounting, and the async batch API."""
from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest
from fake_openai import CANARY, FakeOpenAI, Reply, fast_policy, key_traces, make_channel

from vapo_engine.diagnostics import explain_provider_down
from vapo_engine.providers import (
    ConcurrencyController,
    ConcurrencyPolicy,
    ProviderClient,
    ProviderRequest,
    ProviderWorker,
    run_requests,
)

CHAT = "POST /v1/chat/completions"
MSG = [{"role": "user", "content": "What is 2 + 3?"}]


def requests(count: int, n: int = 1, prefix: str = "p") -> list[ProviderRequest]:
    return [ProviderRequest(id=f"{prefix}{i}", messages=MSG, n=n, meta={"answer": str(i)}) for i in range(count)]


def collect(worker: ProviderWorker, expected: int, deadline_s: float = 20.0) -> list:
    """Drain until `expected` samples arrived (or the deadline: the test then fails on the count)."""
    out, end = [], time.monotonic() + deadline_s
    while len(out) < expected and time.monotonic() < end:
        out += worker.drain()
        time.sleep(0.01)
    return out


def timed(fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_429_storm_with_retry_after_cuts_the_limit_then_restores_it(capsys):
    storm = [Reply.error(429, "Rate limit reached for requests", "rate_limit_exceeded",
                         headers={"retry-after-ms": "150"}) for _ in range(12)]
    for reply in storm:
        reply.delay = 0.05  # the 429s overlap, as a burst's do
    with FakeOpenAI(key=CANARY, delay=0.02) as srv:
        srv.script(CHAT, *storm)
        policy = ConcurrencyPolicy(start=8, decrease_after=2, increase_after=3)
        worker = ProviderWorker(make_channel(srv.base_url), concurrency=policy,
                                retry=fast_policy(max_retries=6)).start()
        t0 = time.monotonic()
        taken, submit_s = timed(worker.submit, requests(6, n=8))
        samples = collect(worker, 48)
        wall = time.monotonic() - t0
        st, history = worker.stats(), worker.controller.limit_history()
        worker.stop()
        chat = [r for r in srv.requests if r.path == "/v1/chat/completions"]
    with capsys.disabled():
        print(f"\n429 storm: limit {[lim for _, lim in history]}, {st.rate_limited} x 429, {st.retries} retries, "
              f"{st.ok}/{st.requests} ok, wall {wall:.2f}s, server in-flight of the 4 retries after the first "
              f"cut: {[r.in_flight for r in chat[8:12]]} (first wave: {[r.in_flight for r in chat[:8]]})")
    assert taken == 6 and submit_s < 0.05
    assert len(samples) == 48 and all(s.ok or s.error for s in samples)
    assert sum(s.ok for s in samples) == 48, [s.error for s in samples if not s.ok][:3]
    assert wall < 15, "no stall"
    assert st.rate_limited == 12 and st.retries == 12 and st.last_retry_after_s == 0.15
    assert st.concurrency_low <= 2 and st.decreases >= 2, "the limit went down"
    assert st.concurrency == 8 and st.increases >= 6, "and back up once the storm ended"
    assert [lim for _, lim in history][:3] == [8, 4, 2]
    assert srv.max_in_flight <= 8
    assert max(r.in_flight for r in chat[8:12]) <= 4, "the retries after the first cut ran at the halved limit"
    assert chat[8].t - chat[0].t >= 0.13, "nothing was sent during the Retry-After cool-down"
    assert {s.request_id for s in samples} == {f"p{i}" for i in range(6)}
    assert sorted(s.index for s in samples if s.request_id == "p3") == list(range(8))


def test_provider_401_marks_it_down_with_the_channels_fix_and_submit_never_blocks():
    with FakeOpenAI(key=CANARY, delay=0.02) as srv:
        channel = make_channel(srv.base_url, key=None)
        worker = ProviderWorker(channel, concurrency=ConcurrencyPolicy(start=4), retry=fast_policy(),
                                explain=partial(explain_provider_down, channel=channel, env={})).start()
        taken = worker.submit(requests(10, n=2))
        samples = collect(worker, 20)
        down = worker.down
        later, submit_s = timed(worker.submit, requests(50, n=2, prefix="q"))
        st = worker.stats()
        worker.stop()
    assert taken == 10 and len(samples) == 20 and not any(s.ok for s in samples)
    assert down is not None and down.kind == "auth" and down.status == 401
    assert down.rule_id == "key-not-exported" and "export TEST_API_KEY=" in down.fix
    assert "provider down (auth)" in down.line() and "fix:" in down.line()
    assert srv.count(CHAT) <= 4, "no more requests after the verdict (at most the first wave)"
    assert {s.error_kind for s in samples} <= {"auth", "provider_down"}
    assert later == 0 and submit_s < 0.05 and st.skipped >= 100, "after the verdict nothing is queued, only counted"
    assert st.metrics()["provider/down"] == 1.0


def test_a_rejected_key_is_explained_without_echoing_it():
    wrong = "sk-wrong-4d9f8e7a6b5c4d3e2f1a0b9c8d7e6f5a"
    with FakeOpenAI(key=CANARY) as srv:
        channel = make_channel(srv.base_url, key=wrong)
        with ProviderWorker(channel, explain=partial(explain_provider_down, channel=channel, env={})) as worker:
            worker.submit(requests(3))
            samples = collect(worker, 3)
            down = worker.down
    assert down is not None and down.kind == "auth" and down.rule_id == "http-401-key-rejected"
    text = down.model_dump_json() + "".join(s.model_dump_json() for s in samples)
    assert not key_traces(text, wrong) and not key_traces(text, CANARY)


def test_a_full_queue_drops_without_blocking_and_counts():
    with FakeOpenAI(key=CANARY, delay=0.5) as srv:
        worker = ProviderWorker(make_channel(srv.base_url), max_pending=3).start()
        taken, submit_s = timed(worker.submit, requests(10))
        again, again_s = timed(worker.submit, requests(5, prefix="q"))
        st_full = worker.stats()
        drained_at_once, drain_s = timed(worker.drain)
        samples = collect(worker, 3)
        refill = worker.submit(requests(2, prefix="r"))
        samples += collect(worker, 2)
        st = worker.stats()
        worker.stop()
    assert (taken, again, refill) == (3, 0, 2)
    assert submit_s < 0.05 and again_s < 0.05 and drain_s < 0.05 and drained_at_once == []
    assert st_full.dropped == 12 and st.dropped == 12 and st.metrics()["provider/dropped"] == 12
    assert sorted(s.request_id for s in samples) == ["p0", "p1", "p2", "r0", "r1"] and all(s.ok for s in samples)
    assert worker.pending == 0 and srv.count(CHAT) == 5


def test_undrained_results_are_bounded_and_counted():
    with FakeOpenAI(key=CANARY) as srv, ProviderWorker(make_channel(srv.base_url), max_results=2) as worker:
        worker.submit(requests(4))
        end = time.monotonic() + 10
        while worker.pending and time.monotonic() < end:
            time.sleep(0.01)
        kept = worker.drain()
        st = worker.stats()
    assert len(kept) == 2 and st.results_dropped == 2 and st.ok == 4


def test_latency_and_token_accounting():
    kw = {"chat_kw": {"temperature": 0.7, "max_tokens": 64}}
    with FakeOpenAI(key=CANARY, delay=0.05) as srv, ProviderWorker(make_channel(srv.base_url), **kw) as worker:
        worker.submit(requests(6, n=2))
        samples = collect(worker, 12)
        m = worker.stats().metrics()
    assert len(samples) == 12 and all(s.ok and s.model_used == "qwen-32b" for s in samples)
    assert all("80" in s.content and s.usage["completion_tokens"] == 12 for s in samples)
    assert m["provider/requests"] == 12 and m["provider/ok"] == 12 and m["provider/failed"] == 0
    assert m["provider/prompt_tokens"] == 12 * 20 and m["provider/completion_tokens"] == 12 * 12
    assert 0.05 <= m["provider/latency_p50_s"] <= m["provider/latency_p95_s"] < 2.0
    assert m["provider/retries"] == 0 and m["provider/rate_limited"] == 0 and m["provider/concurrency"] == 8
    sent = [r.json for r in srv.requests if r.path == "/v1/chat/completions"]
    assert all(b["temperature"] == 0.7 and b["max_tokens"] == 64 and b["stream"] is False for b in sent)


def test_404_after_fallback_is_down_but_a_working_fallback_is_not():
    with FakeOpenAI(key=CANARY, models=["qwen-14b"]) as srv, ProviderWorker(make_channel(srv.base_url)) as worker:
        worker.submit(requests(2))
        samples = collect(worker, 2)
        assert worker.down is None and all(s.ok and s.fallback_from == "qwen-32b" for s in samples)
    with FakeOpenAI(key=CANARY, models=["other"]) as srv:
        channel = make_channel(srv.base_url)
        with ProviderWorker(channel, explain=partial(explain_provider_down, channel=channel, env={})) as worker:
            worker.submit(requests(2))
            collect(worker, 2)
            down = worker.down
    assert down is not None and down.kind == "not_found" and down.rule_id == "http-404-model"
    assert "models.reasoning" in down.fix


def test_a_dead_server_is_marked_failing_after_consecutive_failures():
    with FakeOpenAI(key=CANARY) as srv:
        srv.script(CHAT, *[Reply(503, body="upstream down") for _ in range(40)])
        policy = ConcurrencyPolicy(start=2, down_after_failures=3)
        with ProviderWorker(make_channel(srv.base_url, fallback_model=None), concurrency=policy,
                            retry=fast_policy(max_retries=0)) as worker:
            worker.submit(requests(8))
            samples = collect(worker, 8)
            down = worker.down
    assert len(samples) == 8 and down is not None and down.kind == "failing"
    assert srv.count(CHAT) < 8, "it stopped sending"


def test_run_requests_async_api_with_a_controller():
    async def go(url):
        ctl = ConcurrencyController(ConcurrencyPolicy(start=3))
        async with ProviderClient.from_channel(make_channel(url), controller=ctl) as client:
            out = await run_requests(client, requests(3, n=3), model="qwen-32b", fallback="qwen-14b")
        return out, ctl.stats()
    with FakeOpenAI(key=CANARY, delay=0.03) as srv:
        samples, st = asyncio.run(go(srv.base_url))
        peak = srv.max_in_flight
    assert [(s.request_id, s.index) for s in samples] == [(f"p{i}", j) for i in range(3) for j in range(3)]
    assert all(s.ok for s in samples) and st.ok == 9 and st.in_flight_peak <= 3 and peak <= 3


def test_an_unusable_base_url_is_a_down_verdict_not_a_crash():
    worker = ProviderWorker(make_channel("api.example.com/v1"))
    assert worker.submit(requests(2)) == 2, "taken before start: queued for the thread"
    with worker:
        samples = collect(worker, 2, deadline_s=5)
        down = worker.down
        assert worker.submit(requests(3, prefix="q")) == 0 and worker.stats().skipped == 2 + 3
    assert down is not None and down.kind == "base_url" and "https://" in down.fix
    assert len(samples) == 2 and all(s.error_kind == "provider_down" and not s.ok for s in samples)


def test_stop_is_prompt_even_with_requests_in_flight():
    with FakeOpenAI(key=CANARY, delay=2.0) as srv:
        worker = ProviderWorker(make_channel(srv.base_url)).start()
        worker.submit(requests(4))
        time.sleep(0.1)
        _, stop_s = timed(worker.stop)
    assert stop_s < 1.5 and not worker._thread.is_alive()
    assert worker.submit(requests(1, prefix="late")) == 0
