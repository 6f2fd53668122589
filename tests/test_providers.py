"""Pure parts of vapo_engine.providers: base-URL normalisation, error bodies, the retry table, scrubbing."""
from __future__ import annotations

import email.utils
import time

import pytest
from fake_openai import CANARY, fast_policy

from vapo_engine.config import Secret
from vapo_engine.providers import (
    APIConnectionError,
    BadResponseError,
    BaseURLError,
    RetryPolicy,
    StreamError,
    backoff,
    decide,
    is_model_not_found,
    is_quota_exhausted,
    normalize_base_url,
    parse_error_body,
    rate_limit_headers,
    retry_after_seconds,
    scrub,
    status_error,
)


@pytest.mark.parametrize("raw, url, kinds", [
    ("https://api.example.com/v1", "https://api.example.com/v1", ()),
    ("https://api.example.com/v1/", "https://api.example.com/v1", ("trailing_slash",)),
    ("https://taotoken.net/api", "https://taotoken.net/api/v1", ("missing_v1",)),
    ("https://h/api/v1/v1", "https://h/api/v1", ("double_v1",)),
    ("https://h/api/v1/v1/", "https://h/api/v1", ("trailing_slash", "double_v1")),
    ("https://h/v1/chat/completions", "https://h/v1", ("endpoint_pasted",)),
    ("https://h/v1/models/", "https://h/v1", ("trailing_slash", "endpoint_pasted")),
    ("https://h//v1", "https://h/v1", ("double_slash",)),
    ("  'http://127.0.0.1:8000/v1'  ", "http://127.0.0.1:8000/v1", ("spaces", "quotes")),
    ("https://open.bigmodel.cn/api/paas/v4", "https://open.bigmodel.cn/api/paas/v4", ()),
    ("https://generativelanguage.googleapis.com/v1beta/openai/", ("https://generativelanguage.googleapis.com/"
     "v1beta/openai/v1"), ("trailing_slash", "missing_v1")),
    ("HTTPS://H/v1?x=1", "https://H/v1", ("query",)),
])
def test_normalize_base_url(raw, url, kinds):
    b = normalize_base_url(raw)
    assert b.url == url
    assert b.kinds == kinds
    assert b.endpoint("chat/completions") == url + "/chat/completions"
    assert len(b.changes) == len(kinds)


@pytest.mark.parametrize("raw, kind", [("taotoken.net/api", "no_scheme"), ("ftp://h/v1", "bad_scheme"),
                                       ("", "empty"), ("http:///v1", "no_host"),
                                       ("https://h:99999/api", "malformed"), ("https://h:port/api", "malformed"),
                                       ("https://u:p@[::1/api", "malformed")])
def test_normalize_base_url_refuses(raw, kind):
    with pytest.raises(BaseURLError) as e:
        normalize_base_url(raw)
    assert e.value.kind == kind
    assert e.value.fix


def test_loopback_detection():
    assert normalize_base_url("http://localhost:8000").is_loopback
    assert normalize_base_url("http://127.0.0.5:1/v1").is_loopback
    assert normalize_base_url("http://[::1]:8000/v1").is_loopback
    assert not normalize_base_url("https://api.openai.com/v1").is_loopback


@pytest.mark.parametrize("body, shape, message, code", [
    (('{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, '
     '"code": "invalid_api_key"}}'), "openai", "Incorrect API key provided", "invalid_api_key"),
    ('{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": null, "code": 404}}',
     "vllm", "The model `x` does not exist.", "404"),
    (('{"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError", "param": null, '
     '"code": 404}'), "vllm-legacy", "The model `x` does not exist.", "404"),
    (('{"error": {"message": "litellm.AuthenticationError: bad key", "type": "auth_error", "param": "None", '
     '"code": "401"}}'), "litellm", "litellm.AuthenticationError: bad key", "401"),
    ('{"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}', "llama.cpp",
     "Invalid API Key", "401"),
    ('{"error": "model \'llama3\' not found, try pulling it first"}', "plain-error",
     "model 'llama3' not found, try pulling it first", None),
    ('{"detail": "Not Found"}', "fastapi", "Not Found", None),
    ('{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}', "fastapi",
     "body.messages: field required", None),
    ('{"code": 401, "msg": "invalid token"}', "aggregator", "invalid token", "401"),
    ('{"success": false, "message": "余额不足"}', "aggregator", "余额不足", None),
    ("<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>", "html", "502 Bad Gateway", None),
    ("404 page not found\n", "text", "404 page not found", None),
])
def test_parse_error_body_shapes(body, shape, message, code):
    info = parse_error_body(body)
    assert info is not None and info.shape == shape
    assert info.message == message
    assert info.code == code


@pytest.mark.parametrize("body", ['{"object": "list", "data": []}', '{"id": "c", "choices": []}', "", None,
                                  '{"code": 0, "msg": "ok", "data": {}}'])
def test_parse_error_body_none_for_normal_bodies(body):
    assert parse_error_body(body) is None


def test_error_bodies_are_scrubbed_of_the_key():
    body = f'{{"error": {{"message": "Incorrect API key provided: {CANARY}", "code": "invalid_api_key"}}}}'
    info = parse_error_body(body, [Secret(CANARY)])
    assert CANARY not in info.model_dump_json()
    assert "sk-…" in info.message
    # Credential-shaped strings are redacted even when the key is not known.
    assert CANARY not in scrub(f"Authorization: Bearer {CANARY} and {CANARY}")


def test_scrub_proxy_credentials_and_keeps_ordinary_text():
    assert scrub("http://user:hunter2@proxy:3128") == "http://user:***@proxy:3128"
    assert scrub('"max_tokens": 256, model qwen-32b') == '"max_tokens": 256, model qwen-32b'


def test_model_vs_route_404_and_quota_classification():
    assert is_model_not_found(parse_error_body('{"error": {"message": "x", "code": "model_not_found"}}'))
    assert is_model_not_found(parse_error_body('{"object": "error", "message": "The model `q` does not exist."}'))
    assert not is_model_not_found(parse_error_body('{"detail": "Not Found"}'))
    assert not is_model_not_found(parse_error_body("404 page not found"))
    quota = parse_error_body('{"error": {"message": "You exceeded your current quota", "type": '
                             '"insufficient_quota", "code": "insufficient_quota"}}')
    assert is_quota_exhausted(quota)
    assert not is_quota_exhausted(parse_error_body('{"error": {"message": "Rate limit reached for requests"}}'))


def test_retry_after_parsing():
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "100", "retry-after": "9"}) == 0.1
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds({"retry-after": date}) <= 31
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_rate_limit_headers_filter():
    h = rate_limit_headers({"X-RateLimit-Remaining-Requests": "9", "Retry-After": "2", "Content-Type": "x",
                            "x-request-id": "abc", "Set-Cookie": "s"})
    assert h == {"x-ratelimit-remaining-requests": "9", "retry-after": "2", "x-request-id": "abc"}


def _status(code: int, headers=None, body: str = '{"error": {"message": "m"}}'):
    return status_error(code, parse_error_body(body), body=body, headers=headers or {})


@pytest.mark.parametrize("code", [400, 401, 402, 403, 404, 422])
def test_decision_never_retries_client_errors(code):
    d = decide(_status(code), 1, RetryPolicy())
    assert not d.retry and "never" in d.reason


@pytest.mark.parametrize("code", [408, 409, 429, 500, 502, 503, 504])
def test_decision_retries_transient_statuses(code):
    assert decide(_status(code), 1, RetryPolicy()).retry


def test_decision_honours_retry_after_and_cap():
    pol = RetryPolicy(retry_after_cap=5)
    d = decide(_status(429, {"retry-after-ms": "1500"}), 1, pol)
    assert d.retry and d.wait == 1.5
    d = decide(_status(503, {"retry-after": "2"}), 1, pol)
    assert d.retry and d.wait == 2.0
    d = decide(_status(429, {"retry-after": "120"}), 1, pol)
    assert not d.retry and "cap" in d.reason


def test_decision_quota_and_should_retry_header():
    quota = '{"error": {"message": "insufficient balance", "code": "insufficient_quota"}}'
    assert not decide(_status(429, body=quota), 1, RetryPolicy()).retry
    assert not decide(_status(503, {"x-should-retry": "false"}), 1, RetryPolicy()).retry
    assert decide(_status(418, {"x-should-retry": "true"}), 1, RetryPolicy()).retry
    assert not decide(_status(404, {"x-should-retry": "true"}), 1, RetryPolicy()).retry


def test_decision_for_connection_kinds():
    pol = RetryPolicy()
    for kind in ("dns", "refused", "timeout", "protocol", "connect"):
        assert decide(APIConnectionError("x", kind=kind), 1, pol).retry
    for kind in ("tls", "tls_http", "proxy", "proxy_config"):
        assert not decide(APIConnectionError("x", kind=kind), 1, pol).retry
    assert decide(StreamError("cut"), 1, pol).retry
    assert not decide(BadResponseError("error body"), 1, pol).retry
    assert not decide(ValueError("bug"), 1, pol).retry


def test_backoff_is_exponential_capped_with_jitter():
    no_jitter = RetryPolicy(backoff_base=0.5, backoff_max=4, jitter=0.0)
    assert [backoff(no_jitter, a) for a in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    jittered = RetryPolicy(backoff_base=1.0, backoff_max=8, jitter=0.25, rng=lambda: 1.0)
    assert backoff(jittered, 1) == 0.75
    assert all(0.375 <= backoff(RetryPolicy(jitter=0.25), 2) <= 1.0 for _ in range(50))
    assert fast_policy().max_retries == 2


def test_errors_never_carry_the_key():
    body = f'{{"error": {{"message": "bad key {CANARY}"}}}}'
    e = status_error(401, parse_error_body(body, [CANARY]), body=body, secrets=[CANARY], url="http://h/v1")
    for text in (str(e), repr(e), e.short(), str(e.summary())):
        assert CANARY not in text


def test_layering_no_torch_transformers_or_mcp():
    import subprocess
    import sys
    code = ("import sys, tools.channel, tools.smoke, tools.diagnose, vapo_engine.providers, "
            "vapo_engine.diagnostics; print([m for m in ('torch', 'transformers', 'mcp') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
