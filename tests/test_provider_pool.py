"""The adaptive concurrency controller on its own (real asyncio, real clock): AIMD, the shared Retry-After
cool-down, the provider-down verdicts and the metrics. Against a loopback server: test_provider_worker.py."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from vapo_engine.providers import (
    APIConnectionError,
    ConcurrencyController,
    ConcurrencyPolicy,
    KeyFormatError,
    ProviderDown,
    ProviderDownError,
    ProviderError,
    down_kind,
    parse_error_body,
    status_error,
)


def http_error(status: int, message: str = "slow down", code: str | None = None, **headers: str):
    body = json.dumps({"error": {"message": message, "type": code, "code": code}})
    return status_error(status, parse_error_body(body), body=body,
                        headers={k.replace("_", "-"): v for k, v in headers.items()})


async def attempt(ctl: ConcurrencyController, exc: Exception | None = None, hold: float = 0.0,
                  usage: dict | None = None) -> None:
    """One attempt through a slot: hold it, then succeed or raise `exc` (swallowed here)."""
    try:
        async with ctl.slot() as a:
            await asyncio.sleep(hold)
            a.usage = usage
            if exc is not None:
                raise exc
    except ProviderError as e:
        if e is not exc:
            raise


def test_a_burst_of_429s_halves_the_limit_once_and_successes_grow_it_back():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=8, decrease_after=2, increase_after=2))

    async def go():
        await asyncio.gather(*(attempt(ctl, http_error(429), hold=0.02) for _ in range(8)))
        after_burst = ctl.limit
        await asyncio.gather(*(attempt(ctl, http_error(429)) for _ in range(2)))
        after_second = ctl.limit
        for _ in range(20):
            await attempt(ctl)
        return after_burst, after_second

    after_burst, after_second = asyncio.run(go())
    assert after_burst == 4, "8 requests sent at limit 8 answered 429 cut the limit once, not to 1"
    assert after_second == 2
    assert ctl.limit == 8, "2 successes per +1, capped at the start value"
    st = ctl.stats()
    assert (st.rate_limited, st.decreases, st.increases, st.concurrency_low) == (10, 2, 6, 2)
    assert [limit for _, limit in ctl.limit_history()] == [8, 4, 2, 3, 4, 5, 6, 7, 8]


def test_429s_spread_out_by_successes_do_not_cut_the_limit():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=4, decrease_after=2, window_s=0.05, increase_after=100))

    async def go():
        for _ in range(3):
            await attempt(ctl, http_error(429))
            await asyncio.sleep(0.08)
            await attempt(ctl)
    asyncio.run(go())
    assert ctl.limit == 4 and ctl.stats().rate_limited == 3
    asyncio.run(attempt(ctl, http_error(429)))
    asyncio.run(attempt(ctl, http_error(429)))
    assert ctl.limit == 2, "two 429s in a row (no success between) halve it"


def test_retry_after_pauses_every_new_request_not_only_the_one_that_got_it():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=4))
    starts: list[float] = []

    async def timed():
        async with ctl.slot():
            starts.append(time.monotonic())

    async def go():
        t0 = time.monotonic()
        await attempt(ctl, http_error(429, retry_after_ms="250"))
        await asyncio.gather(*(timed() for _ in range(3)))
        return t0
    t0 = asyncio.run(go())
    assert min(starts) - t0 >= 0.24, [s - t0 for s in starts]
    assert ctl.stats().last_retry_after_s == 0.25 and ctl.limit == 4


def test_a_503_with_retry_after_pauses_too_and_the_cap_bounds_the_pause():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=2, cooldown_cap_s=0.1))

    async def go():
        await attempt(ctl, http_error(503, "overloaded", retry_after="3600"))
        t0 = time.monotonic()
        await attempt(ctl)
        return time.monotonic() - t0
    waited = asyncio.run(go())
    assert 0.05 <= waited < 1.0 and ctl.limit == 2


def test_limit_is_held_while_attempts_are_in_flight():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=3))
    seen: list[int] = []

    async def probe():
        async with ctl.slot():
            seen.append(ctl.in_flight)
            await asyncio.sleep(0.01)

    async def go():
        await asyncio.wait_for(asyncio.gather(*(probe() for _ in range(12))), 5)
    asyncio.run(go())
    assert max(seen) == 3 and ctl.stats().in_flight_peak == 3 and ctl.in_flight == 0


def test_mark_down_wakes_waiters_and_refuses_new_slots():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=1))
    down = ProviderDown(kind="auth", reason="HTTP 401: invalid key", status=401, fix="export KEY=...")

    async def go():
        holder = asyncio.create_task(attempt(ctl, hold=0.2))
        await asyncio.sleep(0.01)
        waiter = asyncio.create_task(attempt(ctl))
        await asyncio.sleep(0.01)
        ctl.mark_down(down)
        t0 = time.monotonic()
        with pytest.raises(ProviderDownError, match="provider down \\(auth\\)"):
            await waiter
        woke = time.monotonic() - t0
        await holder
        return woke
    assert asyncio.run(go()) < 0.1, "the waiter is told at once, not after the holder finishes"
    ctl.mark_down(ProviderDown(kind="quota", reason="later", fix="x"))
    assert ctl.down.kind == "auth", "the first verdict stays"
    assert ctl.stats().metrics()["provider/down"] == 1.0


def test_metrics_latency_tokens_and_names():
    ctl = ConcurrencyController(ConcurrencyPolicy(start=4))

    async def go():
        await asyncio.gather(*(attempt(ctl, hold=0.01 * (i + 1), usage={"prompt_tokens": 10,
                                                                        "completion_tokens": i})
                               for i in range(10)))
        await attempt(ctl, http_error(400, "bad"))
    asyncio.run(go())
    for ok in (True, True, False):
        ctl.record_call(ok)
    ctl.note_retry()
    m = ctl.stats().metrics()
    assert m["provider/prompt_tokens"] == 100 and m["provider/completion_tokens"] == 45
    assert 0.04 <= m["provider/latency_p50_s"] <= m["provider/latency_p95_s"] < 1.0
    assert (m["provider/requests"], m["provider/ok"], m["provider/failed"], m["provider/retries"]) == (3, 2, 1, 1)
    assert m["provider/concurrency"] == 4 and m["provider/rate_limited"] == 0 and m["provider/down"] == 0.0
    assert all(k.startswith("provider/") and isinstance(v, float) for k, v in m.items())


def test_failing_after_consecutive_failed_calls():
    ctl = ConcurrencyController(ConcurrencyPolicy(down_after_failures=3))
    for ok in (False, False, True, False, False):
        ctl.record_call(ok)
    assert not ctl.failing()
    ctl.record_call(False)
    assert ctl.failing()


@pytest.mark.parametrize("exc, kind", [
    (http_error(401, "Incorrect API key provided"), "auth"),
    (http_error(403, "model not enabled for this key"), "forbidden"),
    (http_error(403, "insufficient balance"), "quota"),
    (http_error(402, "payment required"), "quota"),
    (http_error(429, "You exceeded your current quota", "insufficient_quota"), "quota"),
    (http_error(404, "The model `x` does not exist", "model_not_found"), "not_found"),
    (status_error(307, None, headers={"location": "http://elsewhere/v1"}), "redirect"),
    (KeyFormatError("newline in key"), "key_format"),
    (APIConnectionError("CERTIFICATE_VERIFY_FAILED", kind="tls"), "setup"),
    (http_error(429, "Rate limit reached for requests"), None),
    (http_error(500, "boom"), None),
    (http_error(400, "maximum context length exceeded"), None),
    (APIConnectionError("timed out", kind="timeout"), None),
    (APIConnectionError("Connection refused", kind="refused"), None),
])
def test_down_kind_table(exc, kind):
    assert down_kind(exc) == kind


@pytest.mark.parametrize("kw", [{"start": 0}, {"start": 4, "min": 5}, {"start": 8, "max": 4},
                                {"decrease_after": 0}, {"increase_after": 0}])
def test_bad_policies_say_how_to_fix(kw):
    with pytest.raises(ValueError, match="must"):
        ConcurrencyPolicy(**kw)


def test_percentile_is_nearest_rank():
    """The one percentile of the project (pool latencies and the channel evaluation's latency_ms)."""
    from vapo_engine.providers.pool import percentile
    xs = [7.0, 1.0, 3.0, 9.0, 5.0, 2.0, 10.0, 4.0, 8.0, 6.0]
    assert (percentile(xs, 0.5), percentile(xs, 0.95), percentile(xs, 0.0), percentile(xs, 1.0)) == (5.0, 10.0, 1.0, 10.0)
    assert percentile([3.0], 0.95) == 3.0 and percentile([], 0.5) is None
