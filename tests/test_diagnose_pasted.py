"""A pasted error is explained first (docs/design.md §4). An IDE assistant pastes an error from the user's own
program into diagnose_error; the MCP server's own process may have no key. Findings about the pasted error lead;
facts about this server's own channel (key not set, base URL, config files) follow, labelled, and never become
the headline. Checked for every rule that a pasted status / body / headers / text can trigger."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import write_workspace
from tools.diagnose import diagnose_error
from vapo_engine.diagnostics import load_rules
from vapo_engine.diagnostics.engine import SERVER_PREFIX

PASTED_PREDICATES = {"status_in", "status_range", "history_has", "said_matches", "error_present", "model_not_found",
                     "route_not_found", "quota_exhausted", "cooldown", "header_present", "network", "text_matches",
                     "said_mentions_env_name"}
"""Predicates over what the caller pastes (status, body, headers, log/traceback text)."""
LOG_401_429 = ('INFO HTTP Request: POST https://h/v1/chat/completions "HTTP/1.1 401 Unauthorized"\n'
               'INFO HTTP Request: POST https://h/v1/chat/completions "HTTP/1.1 429 Too Many Requests"\n')


def _err(message: str, code: str | None = None, type_: str | None = None) -> str:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


PASTED = {
    "http-401-env-name-as-key": {"status": 401, "body": _err("Incorrect API key provided: TAOTOKEN_API_KEY.",
                                                             "invalid_api_key")},
    "http-401-key-rejected": {"status": 401, "body": _err("Invalid token", "invalid_api_key")},
    "http-403-forbidden": {"status": 403, "body": _err("This key group has no access to model qwen-max")},
    "http-404-route": {"status": 404, "body": '{"detail": "Not Found"}'},
    "http-404-model": {"status": 404, "body": _err("The model `gpt-x` does not exist", "model_not_found")},
    "http-429-cooldown-after-401": {"text": LOG_401_429},
    "http-429-quota": {"status": 429, "body": _err("You exceeded your current quota", "insufficient_quota",
                                                   "insufficient_quota")},
    "http-429-rate-limit": {"status": 429, "headers": {"Retry-After": "20"},
                            "body": _err("Rate limit reached for requests", "rate_limit_exceeded")},
    "http-5xx-server": {"status": 502, "body": "<html><title>502 Bad Gateway</title></html>"},
    "http-400-context-length": {"status": 400, "body": _err("This model's maximum context length is 8192 tokens")},
    "http-400-bad-request": {"status": 422, "body": '{"detail": [{"loc": ["body", "top_p"], "msg": "bad"}]}'},
    "http-200-error-body": {"status": 200, "body": '{"code": 500, "msg": "upstream failed"}'},
    "http-3xx-redirect": {"status": 307, "headers": {"Location": "https://other.example/v1/chat/completions"}},
    "net-dns": {"text": "httpx.ConnectError: [Errno -2] Name or service not known"},
    "net-refused": {"text": "ConnectionRefusedError: [Errno 111] Connection refused"},
    "net-tls-http-port": {"text": "ssl.SSLError: [SSL: WRONG_VERSION_NUMBER] wrong version number"},
    "net-tls-cert": {"text": "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                             "failed: self-signed certificate"},
    "net-timeout": {"text": "httpx.ReadTimeout: The read operation timed out"},
    "net-connection-dropped": {"text": "httpx.RemoteProtocolError: peer closed connection without sending "
                                       "complete message body (incomplete chunked read)"},
    "net-proxy-error": {"text": "httpx.ProxyError: 407 Proxy Authentication Required"},
    "key-not-exported": {"text": "Traceback (most recent call last):\n  File \"train.py\", line 4\n"
                                 "KeyError: 'OPENAI_API_KEY'"},
    "config-read-keyerror": {"text": 'File "train.py", line 3\n    key = cfg["api"]["api_key"]\nKeyError: \'api_key\''},
}


def _leaves(cond: dict) -> set[str]:
    (name, value), = cond.items()
    if name in ("all", "any"):
        return set().union(*(_leaves(c) for c in value))
    return _leaves(value) if name == "not" else {name}


@pytest.fixture
def server_files(tmp_path):
    """The server's own project files (the shipped settings.json / config.toml: base URL without /v1); the
    tests pass env={}, so the server has no key."""
    config, settings = write_workspace(tmp_path)
    return {"settings_path": settings, "config_path": config, "env": {}}


def test_every_pasted_error_rule_has_a_case():
    pasted_rules = {r.id for r in load_rules() if _leaves(r.when) & PASTED_PREDICATES}
    assert pasted_rules == set(PASTED)


@pytest.mark.parametrize("rule_id", sorted(PASTED))
def test_the_pasted_error_leads_and_server_facts_follow_labelled(rule_id, server_files):
    d = diagnose_error(**PASTED[rule_id], **server_files, limit=50)
    ids = [f.rule_id for f in d.findings]
    top = d.findings[0]
    assert top.rule_id == rule_id and top.scope == "given", ids
    assert d.summary.startswith(top.title)
    scopes = [f.scope for f in d.findings]
    first_server = scopes.index("server_channel")
    assert all(s == "server_channel" for s in scopes[first_server:]), "server facts rank below every given one"
    server = {f.rule_id for f in d.findings if f.scope == "server_channel"}
    assert "url-missing-v1" in server and ("key-not-exported" in server or rule_id == "key-not-exported")
    for f in d.findings:
        assert f.title.startswith(SERVER_PREFIX) == (f.scope == "server_channel"), f.title
    given = json.dumps([f.model_dump() for f in d.findings if f.scope == "given"])
    assert "taotoken.net" not in given, "a finding about the pasted error does not quote the server's own URL"
    assert not re.search(r"<[a-z_]+>", given), "every fact it quotes is known or worded plainly"


def test_a_pasted_429_with_retry_after_is_a_rate_limit_with_the_group_sampling_advice(server_files):
    d = diagnose_error(status=429, headers={"Retry-After": "20"},
                       body=_err("Rate limit reached for requests", "rate_limit_exceeded"), **server_files)
    top = d.findings[0]
    assert top.rule_id == "http-429-rate-limit" and top.title.startswith("HTTP 429: rate limit")
    assert "Retry-After: 20s" in top.evidence[0]
    for advice in ("Retry-After", "concurrency", "group_size"):
        assert advice in top.fix
    key = next(f for f in d.findings if f.rule_id == "key-not-exported")
    assert key.scope == "server_channel" and key.title == SERVER_PREFIX + "The API key is not set"
    assert "API key" not in d.summary


def test_the_same_facts_without_a_pasted_error_keep_the_channel_headline(server_files):
    d = diagnose_error(**server_files)
    assert d.findings[0].rule_id == "key-not-exported" and d.findings[0].scope == "given"
    assert not any(f.title.startswith(SERVER_PREFIX) for f in d.findings)


def test_a_pasted_error_nothing_matches_does_not_get_a_channel_headline(server_files):
    d = diagnose_error(status=418, body="I'm a teapot", **server_files)
    assert d.findings and all(f.scope == "server_channel" for f in d.findings)
    assert d.summary.startswith("no known problem matched the error you gave")


def test_a_caller_given_base_url_and_model_count_as_the_callers(server_files):
    d = diagnose_error(status=404, body='{"detail": "Not Found"}', base_url="https://h/api/v1/", model="m-1",
                       **server_files)
    top = d.findings[0]
    assert top.rule_id == "http-404-route" and "https://h/api/v1" in top.fix and top.scope == "given"
    assert top.score >= 85 + 20 + 3 + 15, "the caller's repaired URL boosts the route finding"


@pytest.mark.anyio
async def test_through_the_mcp_tool_with_no_key_in_the_servers_environment(proj, monkeypatch):
    from mcp import Client

    from server.app import build_server
    monkeypatch.delenv("TAOTOKEN_API_KEY", raising=False)
    async with Client(build_server()) as c:
        res = await c.call_tool("diagnose_error", {
            "status": 429, "headers": {"retry-after-ms": "1500"},
            "body": {"error": {"message": "Rate limit reached for requests", "code": "rate_limit_exceeded"}}})
    assert not res.is_error
    findings = res.structured_content["findings"]
    assert findings[0]["rule_id"] == "http-429-rate-limit" and "Retry-After: 1.5s" in findings[0]["evidence"][0]
    key = [f for f in findings if f["rule_id"] == "key-not-exported"]
    assert key and key[0]["scope"] == "server_channel" and key[0]["title"].startswith(SERVER_PREFIX)
    assert res.structured_content["summary"].startswith("HTTP 429: rate limit")
