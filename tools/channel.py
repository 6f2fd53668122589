"""`check_channel`: is the OpenAI-compatible channel usable? (docs/design.md §4) — and `smoke_test`, re-exported.

What a user would do by hand with curl, in one call: normalise the base URL and say what was repaired, show
which source the key came from (redacted), `GET /models` with and without the key (is auth enforced?), look
for the reasoning and fallback models (with close matches), send a minimal chat completion and record its
status like `curl -w %{http_code}` (000 = no HTTP response), the latency and the rate-limit headers, then
run the diagnostics knowledge base over everything seen and return the ranked findings with their fixes.

Plain async functions returning pydantic models (the MCP server wires them later); `*_sync` wrappers are
for the CLI. Nothing here prints; nothing returned holds the key: the client scrubs everything the server
sends (headers, model ids, bodies, answers), and the finished report is scrubbed once more (`scrubbed`).
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from vapo_engine.config import Channel
from vapo_engine.diagnostics import Diagnosis, Evidence, channel_facts, close_matches, diagnose, error_facts
from vapo_engine.providers import (
    APIConnectionError,
    BaseURLError,
    ModelList,
    ProviderClient,
    ProviderError,
    RetryPolicy,
    is_model_unavailable,
    normalize_base_url,
    scrub,
)

from .channel_support import Progress, load_channel, report_progress, scrubbed
from .smoke import SmokeResult, smoke_test, smoke_test_sync

MAX_MODELS_SHOWN = 20
PROBE_PROMPT = [{"role": "user", "content": "Reply with the single word: OK"}]

__all__ = ["ChannelReport", "ModelAvailability", "Probe", "SmokeResult", "check_channel", "check_channel_sync",
           "load_channel", "smoke_test", "smoke_test_sync"]


class Probe(BaseModel):
    """One request of the check, like a curl call."""

    name: str
    url: str
    ok: bool
    http_code: str = "000"
    """The status as `curl -w %{http_code}` prints it: 000 when no HTTP response arrived."""
    latency_ms: float | None = None
    attempts: int = 1
    detail: str = ""
    error: str | None = None
    error_kind: str | None = None
    rate_limit_headers: dict[str, str] = Field(default_factory=dict)


class ModelAvailability(BaseModel):
    role: Literal["reasoning", "fallback"]
    name: str
    listed: bool | None = None
    """None when GET /models did not answer."""
    close_matches: list[str] = Field(default_factory=list)


class ChannelReport(BaseModel):
    """Result of `check_channel`."""

    ok: bool
    verdict: Literal["ok", "warning", "failed"]
    summary: str
    fix: str | None = None
    base_url: str
    base_url_raw: str
    base_url_source: str
    base_url_changes: list[str] = Field(default_factory=list)
    api_key_env: str
    key: str
    key_source: str
    auth_enforced: bool | None = None
    models_count: int | None = None
    models_sample: list[str] = Field(default_factory=list)
    models: list[ModelAvailability] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    http_code: str = "000"
    latency_ms: float | None = None
    rate_limit_headers: dict[str, str] = Field(default_factory=dict)
    diagnosis: Diagnosis = Field(default_factory=Diagnosis)


def _probe_ok(name: str, url: str, ms: ModelList) -> Probe:
    return Probe(name=name, url=url, ok=True, http_code=str(ms.status), latency_ms=ms.latency_s * 1000,
                 attempts=ms.attempts, detail=f"{len(ms.ids)} models listed",
                 rate_limit_headers=ms.rate_limit_headers)


def _probe_err(name: str, url: str, e: ProviderError, t0: float) -> Probe:
    return Probe(name=name, url=url, ok=False, http_code=str(e.status) if e.status else "000",
                 latency_ms=(time.perf_counter() - t0) * 1000, attempts=e.attempts, error=e.short()[:400],
                 error_kind=e.kind, rate_limit_headers=e.headers)


async def _models(client: ProviderClient, auth: bool) -> tuple[Probe, ModelList | None, ProviderError | None]:
    name = "GET /models" if auth else "GET /models (no key)"
    url, t0 = scrub(client.base.endpoint("models")), time.perf_counter()
    try:
        ms = await client.list_models(auth=auth, retry=auth)
        return _probe_ok(name, url, ms), ms, None
    except ProviderError as e:
        return _probe_err(name, url, e, t0), None, e


async def _chat(client: ProviderClient, model: str, label: str) -> tuple[Probe, ProviderError | None]:
    url, t0 = scrub(client.base.endpoint("chat/completions")), time.perf_counter()
    try:
        r = await client.chat(PROBE_PROMPT, model=model, max_tokens=16, stream=False)
    except ProviderError as e:
        return _probe_err(label, url, e, t0), e
    text = (r.content or r.reasoning).strip().replace("\n", " ")[:60]
    ok = r.choices > 0
    detail = f"model {r.model_used} answered {text!r}" if ok else "HTTP 200 but no choices in the body"
    return Probe(name=label, url=url, ok=ok, http_code=str(r.status), latency_ms=r.latency_s * 1000,
                 attempts=r.attempts, detail=detail, error=None if ok else detail,
                 error_kind=None if ok else "empty_choices", rate_limit_headers=r.rate_limit_headers), None


def _availability(channel: Channel, ids: list[str] | None) -> list[ModelAvailability]:
    out = []
    for role, name in (("reasoning", channel.reasoning_model), ("fallback", channel.fallback_model)):
        if name:
            listed = None if ids is None else name in ids
            out.append(ModelAvailability(role=role, name=name, listed=listed,
                                         close_matches=close_matches(name, ids) if ids and not listed else []))
    return out


def _auth_enforced(probe: Probe | None) -> bool | None:
    """From a request sent without a key: 401/403 → enforced, 200 → not enforced, else unknown."""
    if probe is None:
        return None
    if probe.http_code in ("401", "403"):
        return True
    return False if probe.ok else None


def _base_report(channel: Channel) -> dict[str, Any]:
    pub = channel.public()
    return {"base_url_raw": scrub(channel.base_url), "base_url_source": channel.base_url_source,
            "api_key_env": channel.api_key_env, "key": pub["key"], "key_source": channel.key_source}


async def check_channel(channel: Channel | None = None, *, settings_path: str | Path = "settings.json",
                        config_path: str | Path | None = "config.toml", env: Mapping[str, str] | None = None,
                        policy: RetryPolicy | None = None, probe_chat: bool = True,
                        on_progress: Progress | None = None, client: ProviderClient | None = None
                        ) -> ChannelReport:
    """Check the channel (from `channel`, or from settings/config files) and diagnose what fails."""
    channel = channel or load_channel(settings_path, config_path, env)
    await report_progress(on_progress, 0.05, "channel resolved")
    own = client is None
    try:
        base = normalize_base_url(channel.base_url)
        client = client or ProviderClient.from_channel(channel, base_url=base,
                                                       **({"policy": policy} if policy else {}))
    except BaseURLError as e:
        return scrubbed(_unusable_url(channel, env, e), channel)
    try:
        return scrubbed(await _run_checks(channel, client, env, probe_chat, on_progress), channel)
    finally:
        if own:
            await client.aclose()


async def _run_checks(channel: Channel, client: ProviderClient, env, probe_chat: bool,
                      on_progress: Progress | None) -> ChannelReport:
    probes: list[Probe] = []
    await report_progress(on_progress, 0.15, "GET /models")
    p_models, ms, models_err = await _models(client, auth=True)
    probes.append(p_models)
    offline = isinstance(models_err, APIConnectionError)
    p_noauth = None if channel.key is not None else p_models
    if channel.key is not None and not offline:
        await report_progress(on_progress, 0.35, "GET /models without the key")
        p_noauth = (await _models(client, auth=False))[0]
        probes.append(p_noauth)
    primary = models_err
    if probe_chat and not offline:
        await report_progress(on_progress, 0.55, f"POST /chat/completions ({channel.reasoning_model})")
        p_chat, primary = await _chat(client, channel.reasoning_model, "POST /chat/completions")
        probes.append(p_chat)
        fb = channel.fallback_model
        if primary is not None and fb and fb != channel.reasoning_model and is_model_unavailable(primary):
            await report_progress(on_progress, 0.75, f"POST /chat/completions (fallback {fb})")
            probes.append((await _chat(client, fb, f"POST /chat/completions (fallback {fb})"))[0])
    await report_progress(on_progress, 0.9, "diagnosing")
    report = _assemble(channel, client, probes, ms, primary, _auth_enforced(p_noauth), env)
    await report_progress(on_progress, 1.0, report.verdict)
    return report


def _evidence(channel: Channel, env, ms: ModelList | None, primary: ProviderError | None,
              probes: list[Probe]) -> Evidence:
    fields: dict[str, Any] = channel_facts(channel, os.environ if env is None else env)
    fields["models_listed"] = ms.ids if ms else None
    fields["inputs"] = ["channel", "live probes"]
    if primary is not None:
        fields.update({k: v for k, v in error_facts(primary).items() if v not in (None, {}, "")})
        fields["model"] = channel.reasoning_model
        earlier = [int(p.http_code) for p in probes if p.http_code not in ("000", "200")
                   and "(no key)" not in p.name]
        if earlier and earlier[-1] == primary.status:
            earlier = earlier[:-1]
        fields["history"] = earlier
    return Evidence(**fields)


def _verdict(probes: list[Probe], models: list[ModelAvailability], diagnosis: Diagnosis) -> str:
    chat = next((p for p in probes if p.name == "POST /chat/completions"), None)
    fallback_ok = any(p.ok for p in probes if "(fallback" in p.name)
    if not (chat.ok or fallback_ok if chat is not None else probes[0].ok):
        return "failed"
    worrying = any(f.severity in ("critical", "error", "warning") for f in diagnosis.findings)
    if (chat is not None and not chat.ok) or not probes[0].ok or worrying \
            or any(m.listed is False for m in models):
        return "warning"
    return "ok"


def _assemble(channel: Channel, client: ProviderClient, probes: list[Probe], ms: ModelList | None,
              primary: ProviderError | None, auth_enforced: bool | None, env) -> ChannelReport:
    diagnosis = diagnose(_evidence(channel, env, ms, primary, probes))
    models = _availability(channel, ms.ids if ms else None)
    verdict = _verdict(probes, models, diagnosis)
    main = next((p for p in probes if p.name == "POST /chat/completions"), probes[0])
    top = diagnosis.findings[0] if diagnosis.findings else None
    if verdict == "ok":
        summary = f"channel OK: HTTP {main.http_code} in {main.latency_ms or 0:.0f} ms ({main.detail})"
    elif verdict == "warning":
        notes = [p.name + ": " + (p.error or "") for p in probes if not p.ok and "(no key)" not in p.name]
        notes += [f"{m.role} model {m.name} is not listed by GET /models" for m in models if m.listed is False]
        notes += [top.title] if top and top.severity != "info" else []
        summary = "channel usable, with warnings: " + "; ".join(notes)
    else:
        summary = f"channel FAILED (http_code {main.http_code}): " + (top.title if top else main.error or "")
    return ChannelReport(
        ok=verdict != "failed", verdict=verdict, summary=summary[:600], fix=top.fix if top else None,
        base_url=scrub(client.base.url), base_url_changes=client.base.changes, auth_enforced=auth_enforced,
        models_count=len(ms.ids) if ms else None, models_sample=(ms.ids if ms else [])[:MAX_MODELS_SHOWN],
        models=models, probes=probes, http_code=main.http_code, latency_ms=main.latency_ms,
        rate_limit_headers=main.rate_limit_headers or probes[0].rate_limit_headers, diagnosis=diagnosis,
        **_base_report(channel))


def _unusable_url(channel: Channel, env, error: BaseURLError) -> ChannelReport:
    ev = Evidence(**channel_facts(channel, os.environ if env is None else env), inputs=["channel"])
    diagnosis = diagnose(ev)
    top = diagnosis.findings[0] if diagnosis.findings else None
    why = ev.url.error if ev.url and ev.url.error else None
    return ChannelReport(ok=False, verdict="failed", summary=f"base URL unusable: {why or error.message}",
                         fix=top.fix if top and why else error.fix, base_url=scrub(channel.base_url), diagnosis=diagnosis,
                         **_base_report(channel))


def check_channel_sync(*args: Any, **kw: Any) -> ChannelReport:
    """`check_channel` for synchronous callers (the CLI)."""
    return anyio.run(lambda: check_channel(*args, **kw))
