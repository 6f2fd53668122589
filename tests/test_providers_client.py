"""ProviderClient against a real HTTP server on 127.0.0.1: retries, timing, streaming, fallback, secrets."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest
from fake_openai import CANARY, FakeOpenAI, Reply, closed_port, fast_policy, sse_events

from vapo_engine.config import Secret
from vapo_engine.providers import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BadResponseError,
    KeyFormatError,
    NotFoundError,
    ProviderClient,
    RateLimitError,
    StreamError,
    UnprocessableEntityError,
)

CHAT = "POST /v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake():
    with FakeOpenAI(key=CANARY) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _debug_logs(caplog):
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text


def run(coro):
    return asyncio.run(coro)


def client(url: str, key: str | None = CANARY, **kw) -> ProviderClient:
    kw.setdefault("policy", fast_policy())
    kw.setdefault("timeout", 2.0)
    return ProviderClient(url, Secret(key) if key is not None else None, **kw)


async def _chat(url, key=CANARY, **kw):
    ckw = {k: kw.pop(k) for k in ("policy", "timeout", "headers", "max_concurrency") if k in kw}
    async with client(url, key, **ckw) as c:
        return await c.chat(MSG, model=kw.pop("model", "qwen-32b"), **kw)


def test_models_and_chat_plain_and_stream(fake):
    async def go():
        async with client(fake.url, headers={"X-Team": "rl"}) as c:
            models = await c.list_models()
            plain = await c.chat(MSG, model="qwen-32b", temperature=0.2, max_tokens=32)
            streamed = await c.chat(MSG, model="qwen-32b", stream=True)
            return models, plain, streamed
    models, plain, streamed = run(go())
    assert models.ids == ["qwen-32b", "qwen-14b"] and models.status == 200
    assert "80" in plain.content and plain.choices == 1 and plain.usage["total_tokens"] == 32
    assert streamed.streamed and streamed.content == plain.content and streamed.finish_reason == "stop"
    assert streamed.ttft_s is not None
    req = fake.requests[1]
    assert req.headers["authorization"] == f"Bearer {CANARY}" and req.headers["x-team"] == "rl"
    assert req.json["temperature"] == 0.2 and req.json["max_tokens"] == 32 and req.json["stream"] is False


def test_429_honours_retry_after_ms(fake):
    fake.script(CHAT, Reply.error(429, "Rate limit reached", headers={"retry-after-ms": "300"}))
    t0 = time.monotonic()
    r = run(_chat(fake.url))
    assert r.attempts == 2 and fake.count(CHAT) == 2
    gap = fake.times(CHAT)[1] - fake.times(CHAT)[0]
    assert 0.28 <= gap < 2.0 and time.monotonic() - t0 < 3.0


def test_429_honours_retry_after_seconds(fake):
    fake.script(CHAT, Reply.error(429, "slow down", headers={"retry-after": "1"}))
    run(_chat(fake.url))
    gap = fake.times(CHAT)[1] - fake.times(CHAT)[0]
    assert 0.95 <= gap < 3.0


def test_429_without_retry_after_backs_off_then_gives_up(fake):
    fake.script(CHAT, *[Reply.error(429, "Rate limit reached for requests")] * 3)
    with pytest.raises(RateLimitError) as e:
        run(_chat(fake.url))
    assert fake.count(CHAT) == 3 and e.value.attempts == 3
    assert "gave up after 3 attempts" in e.value.gave_up


def test_retry_after_longer_than_cap_gives_up_at_once(fake):
    fake.script(CHAT, Reply.error(429, "come back later", headers={"retry-after": "600"}))
    t0 = time.monotonic()
    with pytest.raises(RateLimitError) as e:
        run(_chat(fake.url))
    assert fake.count(CHAT) == 1 and time.monotonic() - t0 < 2.0
    assert "cap" in e.value.gave_up and e.value.headers["retry-after"] == "600"


def test_quota_429_is_not_retried(fake):
    fake.script(CHAT, Reply.error(429, "You exceeded your current quota", "insufficient_quota",
                                  "insufficient_quota"))
    with pytest.raises(RateLimitError) as e:
        run(_chat(fake.url))
    assert fake.count(CHAT) == 1 and e.value.quota_exhausted


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_retried_then_success(fake, status):
    fake.script(CHAT, Reply(status, body="<html><title>upstream down</title></html>"))
    assert run(_chat(fake.url)).attempts == 2


@pytest.mark.parametrize("status, exc", [(400, BadRequestError), (401, AuthenticationError),
                                         (404, NotFoundError), (422, UnprocessableEntityError)])
def test_client_errors_are_never_retried(fake, status, exc):
    fake.script(CHAT, Reply.error(status, "nope"))
    t0 = time.monotonic()
    with pytest.raises(exc) as e:
        run(_chat(fake.url))
    assert fake.count(CHAT) == 1 and e.value.attempts == 1 and time.monotonic() - t0 < 2.0
    assert "never retried" in e.value.gave_up


def test_401_echoing_the_key_is_scrubbed(fake):
    with pytest.raises(AuthenticationError) as e:
        run(_chat(fake.url, key="sk-canary-wrong-0000000000000000000000000000"))
    assert "Incorrect API key" in str(e.value)
    assert "sk-canary-wrong-0000000000000000000000000000" not in str(e.value.summary())


def test_404_route_vs_model(fake):
    with pytest.raises(NotFoundError) as model:
        run(_chat(fake.url, model="qwen-999b"))
    assert model.value.target == "model"
    with pytest.raises(NotFoundError) as route:
        run(_chat(fake.url + "/api"))
    assert route.value.target == "route" and fake.requests[-1].path == "/api/v1/chat/completions"


def test_200_with_error_body_and_not_json(fake):
    fake.script(CHAT, Reply(200, json={"error": {"message": "upstream auth failed", "code": 401}}),
                Reply(200, body="<html>proxy login</html>"))
    with pytest.raises(BadResponseError) as e:
        run(_chat(fake.url))
    assert e.value.kind == "error_body" and e.value.status == 200 and fake.count(CHAT) == 1
    with pytest.raises(BadResponseError) as e2:
        run(_chat(fake.url))
    assert e2.value.kind == "not_json"


def test_broken_stream_is_retried_then_succeeds(fake):
    fake.script(CHAT, Reply.stream(break_after=2))
    r = run(_chat(fake.url, stream=True))
    assert r.attempts == 2 and "80" in r.content


def test_always_broken_stream_raises_stream_error(fake):
    fake.script(CHAT, *[Reply.stream(break_after=1)] * 3)
    with pytest.raises(StreamError) as e:
        run(_chat(fake.url, stream=True))
    assert e.value.kind == "stream_broken" and e.value.attempts == 3 and e.value.partial


def test_stream_without_done_or_with_bad_json_or_error_event(fake):
    fake.script(CHAT, Reply(sse=sse_events("partial", "qwen-32b", done=False)[:-1]),
                Reply(sse=["{not json"]), Reply(sse=[{"error": {"message": "upstream overloaded"}}]))
    with pytest.raises(StreamError) as e:
        run(_chat(fake.url, stream=True, policy=fast_policy(max_retries=0)))
    assert "without [DONE]" in str(e.value)
    with pytest.raises(StreamError) as e:
        run(_chat(fake.url, stream=True, policy=fast_policy(max_retries=0)))
    assert "not JSON" in str(e.value)
    with pytest.raises(StreamError) as e:
        run(_chat(fake.url, stream=True))
    assert e.value.kind == "stream_error" and fake.count(CHAT) == 3


def test_stream_request_answered_with_plain_json(fake):
    fake.script(CHAT, Reply.ok("plain 80"))
    r = run(_chat(fake.url, stream=True))
    assert r.content == "plain 80" and not r.streamed


def test_slow_response_times_out_with_retries(fake):
    fake.script(CHAT, Reply(delay=0.8, json={}), Reply(delay=0.8, json={}))
    t0 = time.monotonic()
    with pytest.raises(APITimeoutError) as e:
        run(_chat(fake.url, timeout=0.25, policy=fast_policy(max_retries=1)))
    assert e.value.kind == "timeout" and e.value.attempts == 2 and fake.count(CHAT) == 2
    assert time.monotonic() - t0 < 4.0


def test_connection_refused_dns_and_tls(fake):
    with pytest.raises(APIConnectionError) as refused:
        run(_chat(f"http://127.0.0.1:{closed_port()}"))
    assert refused.value.kind == "refused" and refused.value.attempts == 3
    with pytest.raises(APIConnectionError) as dns:
        run(_chat("http://no-such-host.invalid", policy=fast_policy(max_retries=0)))
    assert dns.value.kind == "dns"
    with pytest.raises(APIConnectionError) as tls:
        run(_chat(fake.url.replace("http://", "https://")))
    assert tls.value.kind == "tls_http" and tls.value.attempts == 1


def test_key_that_cannot_be_a_header_is_never_sent(fake):
    with pytest.raises(KeyFormatError) as e:
        run(_chat(fake.url, key=CANARY + "\n"))
    assert fake.count(CHAT) == 0 and CANARY not in str(e.value)


def test_fallback_on_model_not_found_and_on_5xx(fake):
    async def go(**kw):
        async with client(fake.url) as c:
            return await c.chat_with_fallback(MSG, model=kw.pop("model", "qwen-32b"), fallback="qwen-14b", **kw)
    r = run(go(model="qwen-999b"))
    assert r.model_used == "qwen-14b" and r.fallback_from == "qwen-999b" and "404" in r.fallback_reason
    fake.script(CHAT, *[Reply(503, json={"error": {"message": "overloaded"}})] * 3)
    r = run(go())
    assert r.model_used == "qwen-14b" and fake.requests[-1].json["model"] == "qwen-14b"


def test_no_fallback_on_auth_or_route_errors(fake):
    async def go(url, key=CANARY):
        async with client(url, key) as c:
            return await c.chat_with_fallback(MSG, model="qwen-32b", fallback="qwen-14b")
    with pytest.raises(AuthenticationError):
        run(go(fake.url, key="sk-canary-bad-key-000000000000000000000"))
    with pytest.raises(NotFoundError):
        run(go(fake.url + "/wrong"))
    assert fake.count(CHAT) == 1


def test_fallback_failure_keeps_both_reasons(fake):
    fake.models = ["other"]

    async def go():
        async with client(fake.url) as c:
            return await c.chat_with_fallback(MSG, model="qwen-32b", fallback="qwen-14b")
    with pytest.raises(NotFoundError) as e:
        run(go())
    assert e.value.model == "qwen-14b" and "qwen-32b" in e.value.summary()["notes"][0]


def test_concurrency_limit_for_group_sampling(fake):
    fake.script(CHAT, *[Reply(delay=0.15, json=Reply.ok().json)] * 8)

    async def go():
        async with client(fake.url, max_concurrency=2) as c:
            return await c.sample(MSG, 8, model="qwen-32b")
    t0 = time.monotonic()
    results = run(go())
    assert len(results) == 8 and all(not isinstance(r, Exception) for r in results)
    assert fake.max_in_flight == 2 and time.monotonic() - t0 >= 0.55


def test_repr_never_shows_the_key(fake):
    c = client(fake.url)
    assert CANARY not in repr(c) and "sk-…" in repr(c)
