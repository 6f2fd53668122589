"""check_channel and smoke_test against a real OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py)."""
from __future__ import annotations

import itertools
import logging

import pytest
from fake_openai import CANARY, FakeOpenAI, Reply, closed_port, fast_policy, make_channel, sse_events

from tools.channel import check_channel_sync, smoke_test_sync

CHAT = "POST /v1/chat/completions"


@pytest.fixture
def fake():
    with FakeOpenAI(key=CANARY) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _no_secret_in_logs(caplog, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text


def check(url, key=CANARY, env=None, **kw):
    report = check_channel_sync(make_channel(url, key, **kw), policy=fast_policy(), env=env or {})
    assert CANARY not in report.model_dump_json()
    return report


def smoke(url, key=CANARY, **kw):
    ch_kw = {k: kw.pop(k) for k in ("stream", "fallback_model", "reasoning_model") if k in kw}
    result = smoke_test_sync(make_channel(url, key, **ch_kw), policy=fast_policy(), env={}, **kw)
    assert CANARY not in result.model_dump_json()
    return result


def ids(report_or_diag) -> list[str]:
    diag = getattr(report_or_diag, "diagnosis", report_or_diag)
    return [f.rule_id for f in diag.findings]


# --- check_channel ------------------------------------------------------------------------------------

def test_check_ok(fake):
    r = check(fake.url + "/v1/")
    assert r.ok and r.verdict == "ok" and r.http_code == "200"
    assert r.base_url == fake.base_url and r.base_url_changes == ["removed a trailing slash"]
    assert r.auth_enforced is True and r.models_count == 2
    assert [m.listed for m in r.models] == [True, True]
    assert [p.name for p in r.probes] == ["GET /models", "GET /models (no key)", "POST /chat/completions"]
    assert r.latency_ms is not None and "sk-…" in r.key and r.key_source.startswith("environment")
    assert fake.requests[1].headers.get("authorization") is None
    assert fake.requests[2].headers["x-test-header"] == "yes"
    assert ids(r) == ["url-trailing-slash"]


def test_check_401_wrong_key(fake):
    r = check(fake.base_url, key="sk-canary-wrong-key-1234567890abcdef1234")
    assert not r.ok and r.verdict == "failed" and r.http_code == "401"
    assert ids(r)[0] == "http-401-key-rejected" and "export TEST_API_KEY" in r.fix
    assert fake.count(CHAT) == 1  # 401 is never retried
    assert "sk-canary-wrong-key-1234567890abcdef1234" not in r.model_dump_json()


def test_check_401_env_var_name_as_key(fake):
    r = check(fake.base_url, key="TEST_API_KEY")
    assert r.http_code == "401" and ids(r)[0] == "http-401-env-name-as-key"
    assert "os.environ" in r.fix


def test_check_missing_key(fake):
    r = check(fake.base_url, key=None)
    assert not r.ok and r.auth_enforced is True and ids(r)[0] == "key-not-exported"


def test_check_403(fake):
    fake.script(CHAT, Reply.error(403, "This key is not allowed to access model qwen-32b", "model_access_denied"))
    r = check(fake.base_url)
    assert r.http_code == "403" and ids(r)[0] == "http-403-forbidden"


def test_check_404_route_wrong_base_url(fake):
    r = check(fake.url + "/api")
    assert r.http_code == "404" and not r.ok
    assert ids(r)[0] == "http-404-route"
    assert r.base_url_changes == ["appended the missing /v1"]


def test_check_404_model_uses_fallback(fake):
    r = check(fake.base_url, reasoning_model="qwen-32B")
    assert r.verdict == "warning" and r.ok and r.http_code == "404"
    assert ids(r)[0] == "http-404-model"
    assert r.models[0].listed is False and r.models[0].close_matches[0] == "qwen-32b"
    assert r.probes[-1].name.startswith("POST /chat/completions (fallback qwen-14b)") and r.probes[-1].ok
    top = r.diagnosis.findings[0]
    assert any("close matches: qwen-32b" in e for e in top.evidence)


@pytest.mark.parametrize("headers, wait", [({"retry-after-ms": "200"}, 0.2), ({}, 0.0)])
def test_check_429_rate_limit(fake, headers, wait):
    fake.script(CHAT, *[Reply.error(429, "Rate limit reached for requests", headers=headers)] * 3)
    r = check(fake.base_url)
    chat, fallback = r.probes[2], r.probes[3]
    assert r.http_code == "429" and chat.attempts == 3 and fallback.ok and r.verdict == "warning"
    assert ids(r)[0] == "http-429-rate-limit"
    times = fake.times(CHAT)[:3]
    assert all(b - a >= wait * 0.9 for a, b in itertools.pairwise(times))


def test_check_429_cooldown_after_401(fake):
    fake.script("GET /v1/models", Reply.error(401, "invalid api key"))
    fake.script(CHAT, *[Reply.error(429, "Too many requests")] * 3)
    r = check(fake.base_url, fallback_model=None)
    assert ids(r)[0] == "http-429-cooldown-after-401"


def test_check_5xx(fake):
    fake.script(CHAT, *[Reply(503, json={"error": {"message": "Service Unavailable"}})] * 6)
    r = check(fake.base_url)
    assert r.http_code == "503" and "http-5xx-server" in ids(r)
    assert fake.count(CHAT) == 6  # 3 attempts for the reasoning model, 3 for the fallback


def test_check_200_with_error_body(fake):
    fake.script(CHAT, Reply(json={"error": {"message": "no available channel for model qwen-32b", "code": 503}}))
    r = check(fake.base_url, fallback_model=None)
    assert not r.ok and r.http_code == "200" and "http-200-error-body" in ids(r)


def test_check_connection_failures(fake):
    refused = check(f"http://127.0.0.1:{closed_port()}/v1")
    assert refused.http_code == "000" and ids(refused)[0] == "net-refused" and len(refused.probes) == 1
    dns = check("http://no-such-host.invalid/v1")
    assert ids(dns)[0] == "net-dns"
    tls = check(fake.base_url.replace("http://", "https://"))
    assert ids(tls)[0] == "net-tls-http-port"


def test_check_timeout(fake):
    fake.script("GET /v1/models", *[Reply(delay=0.6, json={})] * 3)
    r = check(fake.base_url, timeout_seconds=0.2)
    assert r.http_code == "000" and ids(r)[0] == "net-timeout" and r.probes[0].attempts == 3


def test_check_unusable_base_url():
    r = check("127.0.0.1:8000/v1")
    assert not r.ok and r.probes == [] and ids(r)[0] == "url-no-scheme" and "http" in r.fix


def test_check_server_without_auth():
    with FakeOpenAI(key=None) as open_srv:
        r = check(open_srv.base_url)
    assert r.ok and r.auth_enforced is False


def test_check_proxy_capturing_localhost_is_reported_but_bypassed(fake, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://user:pw@127.0.0.1:{closed_port()}")
    r = check(fake.base_url, env={"HTTP_PROXY": "http://user:pw@127.0.0.1:3128", "NO_PROXY": "example.com"})
    assert r.ok and r.http_code == "200"
    assert "net-proxy-captures-localhost" in ids(r) and "pw@" not in r.model_dump_json()
    assert "NO_PROXY=example.com,localhost,127.0.0.1" in r.diagnosis.findings[0].fix


def test_check_remote_url_through_dead_proxy(monkeypatch):
    proxy = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HTTP_PROXY", proxy)
    r = check("http://api.example.test/v1", env={"HTTP_PROXY": proxy})
    assert r.http_code == "000" and "net-proxy-error" in ids(r)


def test_check_progress_callback(fake):
    seen = []
    check_channel_sync(make_channel(fake.base_url), policy=fast_policy(), env={},
                       on_progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) >= 4


# --- smoke_test ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_smoke_pass(fake, stream):
    r = smoke(fake.base_url, stream=stream)
    assert r.passed and r.streamed is stream and r.model_used == "qwen-32b" and "80" in r.answer_excerpt
    req = fake.requests[-1].json
    assert req["temperature"] == 0.2 and req["max_tokens"] == 256 and req["stream"] is stream
    assert req["messages"][0]["role"] == "system" and "240 km in 3 hours" in req["messages"][1]["content"]
    assert r.usage["total_tokens"] == 32 and r.latency_ms > 0


@pytest.mark.parametrize("reply, reason", [
    (Reply.ok("The average speed is 60 km/h."), "wrong answer"),
    (Reply.ok("It is 180 km/h or 800 m/min."), "wrong answer"),
    (Reply(json={"id": "x", "object": "chat.completion", "choices": []}), "no choices"),
    (Reply.ok("", finish_reason="length"), "finish_reason is 'length'"),
    (Reply.ok("Let me think step by step about the", finish_reason="length"), "cut off at max_tokens"),
    (Reply.ok("   "), "empty answer"),
    (Reply(json={"error": {"message": "upstream error: invalid api key", "type": "upstream_error"}}),
     "error body"),
])
def test_smoke_failures_say_why(fake, reply, reason):
    fake.script(CHAT, reply)
    r = smoke(fake.base_url)
    assert not r.passed and reason in r.reason


def test_smoke_broken_stream_fails_after_retries(fake):
    fake.script(CHAT, *[Reply.stream(break_after=1)] * 3)
    r = smoke(fake.base_url, stream=True, fallback_model=None)
    assert not r.passed and "stream broke" in r.reason and r.attempts == 3
    assert "net-connection-dropped" in ids(r.diagnosis)


def test_smoke_broken_stream_recovers(fake):
    fake.script(CHAT, Reply.stream(break_after=1))
    r = smoke(fake.base_url, stream=True)
    assert r.passed and r.attempts == 2


def test_smoke_falls_back_when_reasoning_model_unavailable(fake):
    r = smoke(fake.base_url, reasoning_model="qwen-72b")
    assert r.passed and r.fallback_used and r.model_used == "qwen-14b" and r.model_requested == "qwen-72b"
    assert "404" in r.fallback_reason


def test_smoke_custom_prompt_and_expectation(fake):
    fake.answers["qwen-32b"] = "The capital of France is Paris."
    r = smoke(fake.base_url, prompt="Capital of France?", expect="paris", system_prompt=None)
    assert r.passed and fake.requests[-1].json["messages"] == [{"role": "user", "content": "Capital of France?"}]


def test_smoke_401_gives_diagnosis(fake):
    r = smoke(fake.base_url, key="TEST_API_KEY")
    assert not r.passed and r.http_code == "401" and r.diagnosis.findings[0].rule_id == "http-401-env-name-as-key"


def test_smoke_streaming_progress(fake):
    fake.answers["qwen-32b"] = "x" * 400 + " so the speed is 80 km/h"
    seen = []
    r = smoke_test_sync(make_channel(fake.base_url, stream=True), policy=fast_policy(), env={}, max_tokens=64,
                        on_progress=lambda f, m: seen.append((f, m)))
    assert r.passed and any(m.startswith("streaming") for _, m in seen) and seen[-1] == (1.0, "passed")


def test_smoke_async_progress_callback(fake):
    seen = []

    async def cb(fraction, message):
        seen.append(fraction)
    r = smoke_test_sync(make_channel(fake.base_url, stream=True), policy=fast_policy(), env={}, on_progress=cb)
    assert r.passed and seen[-1] == 1.0


def test_sse_helper_shapes():
    events = sse_events("abc", "m", pieces=3)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "stop"


def test_smoke_unusable_base_url_is_diagnosed():
    r = smoke("127.0.0.1:8000/v1")
    assert not r.passed and "cannot call the API" in r.reason and ids(r.diagnosis)[0] == "url-no-scheme"


def test_credentials_in_base_url_are_never_shown():
    r = check(f"http://user:hunter2secret@127.0.0.1:{closed_port()}/v1")
    assert "hunter2secret" not in r.model_dump_json() and r.http_code == "000"


@pytest.mark.parametrize("text, expected, ok", [
    ("The speed is 80 km/h.", "80", True), ("so \\boxed{80}", "80", True), ("**80.0 km/h**", "80", True),
    ("80.", "80", True), ("180 km/h", "80", False), ("800", "80", False), ("80.5 km/h", "80", False),
    ("8,000 km", "8000", True), ("It is 12.50", "12.5", True), ("PARIS!", "Paris", True), ("Lyon", "Paris", False),
])
def test_contains_answer(text, expected, ok):
    from tools.smoke import contains_answer
    assert contains_answer(text, expected) is ok


# --- credentials besides the key: base-URL user:password@, credential-named default headers ----------------------
HEADER_KEY, URL_PASSWORD = "xkheadervaluesecretonlyletters", "hunter2secret"
HEADERS = {"Content-Type": "application/json", "X-Api-Key": HEADER_KEY}


def test_a_base_url_with_credentials_and_a_key_is_refused_before_any_request(fake):
    """user:password@ in the base URL makes httpx send Basic auth, which would silently replace the Bearer key:
    with a key configured the channel is refused with the fix, and nothing is sent."""
    from vapo_engine.providers import BaseURLError, ProviderClient
    url = fake.base_url.replace("http://", f"http://bob:{URL_PASSWORD}@")
    r = check(url)
    out = r.model_dump_json()
    assert not r.ok and "user:password@" in r.summary and "Bearer key" in r.summary, r.summary
    assert r.fix and "remove user:password@ from api.base_url" in r.fix and URL_PASSWORD not in out
    s = smoke(url)
    assert not s.passed and URL_PASSWORD not in s.model_dump_json()
    with pytest.raises(BaseURLError, match="Basic credentials would silently replace the Bearer key") as e:
        ProviderClient.from_channel(make_channel(url))
    assert URL_PASSWORD not in str(e.value)
    assert fake.requests == []


def test_base_url_credentials_without_a_key_are_sent_and_never_shown():
    """Without a key the URL's credentials are the channel's authentication (Basic): used, and scrubbed from
    everything even when the server echoes the password alone."""
    with FakeOpenAI(key=None) as srv:
        for route in ("GET /v1/models", CHAT):
            srv.script(route, *[Reply.error(403, f"user bob with password {URL_PASSWORD} may not do this")] * 6)
        r = check(srv.base_url.replace("http://", f"http://bob:{URL_PASSWORD}@"), key=None)
        assert srv.requests and all(q.headers["authorization"].startswith("Basic ") for q in srv.requests)
    out = r.model_dump_json()
    assert r.http_code == "403" and "may not do this" in out and URL_PASSWORD not in out, out


def test_a_credential_header_value_is_scrubbed_from_every_output():
    """A default header such as X-Api-Key carries a key too: an error body or answer that echoes its value
    (here one without a digit, so no pattern would catch it) is scrubbed from check_channel and smoke_test."""
    with FakeOpenAI(key=None, answers={"qwen-32b": f"80 km/h. Your header was {HEADER_KEY}"}) as srv:
        srv.script("GET /v1/models", *[Reply.error(403, f"x-api-key {HEADER_KEY} is not allowed here")] * 3)
        r = check(srv.base_url, key=None, headers=HEADERS)
        s = smoke_test_sync(make_channel(srv.base_url, None, headers=HEADERS), policy=fast_policy(), env={})
        assert all(q.headers.get("x-api-key") == HEADER_KEY for q in srv.requests)
    assert "is not allowed here" in r.model_dump_json() and HEADER_KEY not in r.model_dump_json()
    assert s.passed and HEADER_KEY not in s.model_dump_json()


def test_channel_secrets_lists_what_no_output_may_show():
    ch = make_channel(f"https://bob:{URL_PASSWORD}@api.example.com/v1",
                      headers={**HEADERS, "X-Auth-Token": "tok-123456", "Accept": "application/json-long-value",
                               "Api-Key": "short"})
    assert set(ch.secrets()[1:]) == {HEADER_KEY, "tok-123456", URL_PASSWORD}  # not Accept, not a 5-char value
    token_only = make_channel("https://sk-abcdefghijklmnop1234@api.example.com/v1", key=None)
    assert token_only.secrets() == ["sk-abcdefghijklmnop1234"]
