"""The key only ever goes to the configured base URL (docs/design.md §7): a server that redirects (307 / 302 / 301 / 308) to
a second loopback server on another port never gets the key to it — the client does not follow redirects and
reports them with a fix —, the client refuses any other origin, and neither a tool argument nor a config.toml
override (`--set api.base_url=…`) moves the URL that gets the key."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
from fake_openai import CANARY, FakeOpenAI, fast_policy, key_traces, make_channel

from tools.channel import check_channel_sync, smoke_test_sync
from vapo_engine.config import Secret, load_config, load_settings, resolve_channel
from vapo_engine.diagnostics import Evidence, diagnose, error_facts
from vapo_engine.providers import (
    APIConnectionError,
    BaseURLError,
    ProviderClient,
    RedirectError,
    decide,
)

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "TAOTOKEN_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def target():
    """The second server: where a redirect points. It must never see the key."""
    with FakeOpenAI(key=CANARY) as srv:
        yield srv


def never_saw_key(srv: FakeOpenAI) -> bool:
    return not any(key_traces(json.dumps(r.headers) + json.dumps(r.json) + r.path, CANARY) for r in srv.requests)


@pytest.mark.parametrize("status", [307, 302, 301, 308])
def test_chat_redirected_to_another_port_is_not_followed(status, target):
    with FakeOpenAI(key=CANARY, redirect=(status, target.url)) as first:
        async def go():
            async with ProviderClient(first.base_url, Secret(CANARY), policy=fast_policy()) as c:
                return await c.chat(MSG, model="qwen-32b")
        with pytest.raises(RedirectError) as info:
            asyncio.run(go())
        assert first.count("POST /v1/chat/completions") == 1, "a redirect is not retried either"
        assert first.requests[0].headers["authorization"] == f"Bearer {CANARY}", "the configured host got it"
    assert target.requests == [] and never_saw_key(target)
    err = info.value
    assert err.kind == "redirect" and err.status == status and err.location.startswith(target.url)
    assert target.url in str(err) and not decide(err, 1, fast_policy()).retry


def test_check_channel_reports_the_redirect_with_a_fix(target):
    with FakeOpenAI(key=CANARY, redirect=(302, target.url)) as first:
        report = check_channel_sync(make_channel(first.base_url), policy=fast_policy(), env={})
    assert target.requests == [] and never_saw_key(target)
    assert not report.ok and report.http_code == "302"
    top = report.diagnosis.findings[0]
    assert top.rule_id == "http-3xx-redirect" and "api.base_url" in top.fix and target.url in top.fix
    assert CANARY not in report.model_dump_json()


def test_smoke_test_does_not_fall_back_through_a_redirect(target):
    with FakeOpenAI(key=CANARY, redirect=(307, target.url)) as first:
        result = smoke_test_sync(make_channel(first.base_url), policy=fast_policy(), env={})
        sent = first.count("POST /v1/chat/completions")
    assert target.requests == [] and sent == 1
    assert not result.passed and result.http_code == "307" and "redirect not followed" in result.reason
    assert result.diagnosis.findings[0].rule_id == "http-3xx-redirect"


def test_a_location_that_carries_the_key_is_scrubbed(target):
    hostile = f"{target.url}/steal?k={CANARY}&u="
    with FakeOpenAI(key=CANARY, redirect=(307, hostile)) as first:
        async def go():
            async with ProviderClient(first.base_url, Secret(CANARY), policy=fast_policy()) as c:
                await c.list_models()
        with pytest.raises(RedirectError) as info:
            asyncio.run(go())
    err = info.value
    shown = str(err) + json.dumps(err.summary()) + repr(err)
    assert not key_traces(shown, CANARY) and target.url in shown
    diagnosis = diagnose(Evidence(**{k: v for k, v in error_facts(err).items() if v not in (None, {}, "")}))
    assert diagnosis.findings[0].rule_id == "http-3xx-redirect"
    assert not key_traces(diagnosis.model_dump_json(), CANARY)


def test_the_client_refuses_to_put_the_key_on_another_origin(target):
    async def go():
        async with ProviderClient("http://127.0.0.1:9/v1", Secret(CANARY), policy=fast_policy()) as c:
            await c._send("GET", f"{target.base_url}/models", payload=None, auth=True, model=None)
    with pytest.raises(APIConnectionError) as info:
        asyncio.run(go())
    assert info.value.kind == "foreign_origin" and target.requests == []


@pytest.mark.parametrize("other", ["http://127.0.0.1:1/v1", "https://evil.example/v1", "http://localhost:{port}/v1"])
def test_from_channel_refuses_a_base_url_on_another_origin(other, target):
    channel = make_channel(target.base_url)
    port = target.url.rsplit(":", 1)[1]
    with pytest.raises(BaseURLError, match="only to the configured base URL") as info:
        ProviderClient.from_channel(channel, base_url=other.format(port=port))
    assert "settings.json" in info.value.fix
    same = ProviderClient.from_channel(channel, base_url=target.base_url + "/")  # same origin, repaired path
    assert same.base.url == target.base_url


def test_a_config_override_of_api_base_url_does_not_move_the_channel(tmp_path):
    """config.toml's [api].base_url (and `--set api.base_url=…` / start_training overrides) is a copy that only
    draws a warning; the channel's URL comes from settings.json or TAOTOKEN_BASE_URL."""
    from tests.conftest import write_workspace
    config_path, settings_path = write_workspace(tmp_path)
    config = load_config(config_path, ["api.base_url=http://attacker.example/v1"])
    channel, warnings = resolve_channel(load_settings(settings_path), config, env={})
    assert channel.base_url == load_settings(settings_path).api.base_url
    assert "settings.json" in channel.base_url_source
    assert any(w.key == "api.base_url" for w in warnings), "the differing copy is reported"


def test_no_mcp_tool_argument_can_name_a_url_or_a_key():
    from mcp import Client

    from server.app import build_server

    async def schemas():
        async with Client(build_server()) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}
    found = []
    for name, schema in asyncio.run(schemas()).items():
        text = json.dumps(schema.get("properties", {}))
        props = re.findall(r'"([A-Za-z_]+)": \{', text)
        found += [f"{name}.{p}" for p in props
                  if re.search(r"(^|_)(url|uri|host|port|endpoint|base|key|auth|proxy|headers?)($|_)", p, re.IGNORECASE)]
    assert found == ["diagnose_error.headers"], found  # response headers of a pasted error: read, never sent
