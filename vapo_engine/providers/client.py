"""Async client for OpenAI-compatible APIs: `GET /models`, `POST /chat/completions` (plain and SSE).

What it does, in order, for every call: normalise the base URL (`urls.py`), add the settings' default headers
and `Authorization: Bearer <key>` (the only place the key is revealed), wait for a concurrency slot (a fixed
semaphore, or the adaptive `pool.ConcurrencyController` when one is given: shared Retry-After cool-down, AIMD
limit, counters), send, turn every failure into a typed error (`errors.py`), and retry by the table in
`retry.py`. A 200 that holds an error body is an error too.

The key goes only to the base URL's origin: every URL is built from it, `_request_headers` refuses any other
origin, `from_channel` refuses a `base_url` on another origin than the channel's, and redirects are never
followed (httpx `follow_redirects=False`; a 3xx becomes `RedirectError`, saying where it pointed).

`chat_with_fallback` switches to `models.fallback` when the reasoning model is unavailable (404 model-not-found,
5xx or 429 after retries) and the answer says which model answered.

Everything the server sends is untrusted text: headers, JSON bodies (model ids, answers, usage) and SSE
chunks are scrubbed of the key (`redaction.py`) before they leave this module, and the key is guarded in the
HTTP libraries' log records (`guard_logs`), so a server or proxy that echoes the key cannot leak it. Bodies
are read up to a cap (`MAX_RESPONSE_BYTES`; error bodies `MAX_ERROR_BODY_BYTES`, the rest is dropped), and a
large one is parsed and scrubbed away from the event loop (`offload.off_loop`).

Deliberately not here: tools-level verdicts (tools/channel.py), diagnosis (vapo_engine/diagnostics).
Environment proxies are honoured except for loopback base URLs (a proxy never serves 127.0.0.1).
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from pydantic import BaseModel, Field
from typing_extensions import Self

from vapo_engine.config import Channel, Secret
from vapo_engine.config.secrets import channel_credentials

from .errorbody import ErrorInfo, parse_error_body, rate_limit_headers
from .errors import (
    APIConnectionError,
    APITimeoutError,
    BadResponseError,
    KeyFormatError,
    NotFoundError,
    ProviderError,
    RateLimitError,
    ServerError,
    status_error,
)
from .netclass import classify_network_text, exception_text
from .offload import off_loop, plain
from .pool import Attempt, ConcurrencyController
from .redaction import guard_logs, safe_text, scrub
from .retry import RetryPolicy, call_with_retry
from .sse import read_stream
from .urls import URL_CREDENTIALS_WITH_KEY, BaseURL, BaseURLError, normalize_base_url, url_has_credentials

log = logging.getLogger("vapo_engine.providers")
USER_AGENT = "vapo-mcp/0.1"
MAX_ANSWER = 100_000
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""A 2xx body larger than this is refused (`BadResponseError(kind="too_large")`), never read whole."""
MAX_ERROR_BODY_BYTES = 64 * 1024
"""Of an error body, only this much is read (what is shown of it is far shorter)."""


class ChatResult(BaseModel):
    """One chat completion. `model_used` is the model that answered (after any fallback)."""

    model_requested: str
    model_used: str
    model_reported: str | None = None
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    choices: int = 0
    usage: dict[str, Any] | None = None
    status: int = 200
    latency_s: float = 0.0
    elapsed_s: float = 0.0
    ttft_s: float | None = None
    attempts: int = 1
    streamed: bool = False
    rate_limit_headers: dict[str, str] = Field(default_factory=dict)
    fallback_from: str | None = None
    fallback_reason: str | None = None


class ModelList(BaseModel):
    """`GET /models`: the ids, the status and how long it took."""

    ids: list[str] = Field(default_factory=list)
    status: int = 200
    latency_s: float = 0.0
    attempts: int = 1
    auth_sent: bool = True
    rate_limit_headers: dict[str, str] = Field(default_factory=dict)


def is_model_unavailable(exc: BaseException) -> bool:
    """Errors after which the fallback model is tried (docs/design.md §2.1): model-not-found, 5xx, 429 (not quota)."""
    if isinstance(exc, NotFoundError):
        return exc.target == "model"
    if isinstance(exc, RateLimitError):
        return not exc.quota_exhausted
    if isinstance(exc, ServerError):
        return True
    if isinstance(exc, BadResponseError) and exc.info is not None:
        from .errorbody import is_model_not_found
        return is_model_not_found(exc.info, "", exc.model)
    return False


class ProviderClient:
    """One channel: base URL + key + headers + timeout + retry policy + a concurrency limit."""

    def __init__(self, base_url: str | BaseURL, key: Secret | None = None, *,
                 headers: Mapping[str, str] | None = None, timeout: float = 120.0, max_retries: int = 3,
                 policy: RetryPolicy | None = None, max_concurrency: int = 8, trust_env: bool | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 controller: ConcurrencyController | None = None):
        self.base = base_url if isinstance(base_url, BaseURL) else normalize_base_url(base_url)
        self._key = key
        self._headers = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
        self._credentials = tuple(channel_credentials(self.base.url, self._headers))
        for secret in (key, *self._credentials):
            if secret is not None:
                guard_logs(secret)
        if key is not None and url_has_credentials(self.base.url):
            raise BaseURLError(self.base.url, URL_CREDENTIALS_WITH_KEY,
                               "it carries user:password@ credentials and an API key is configured; a request has "
                               "one Authorization header, and the URL's Basic credentials would silently replace "
                               "the Bearer key", "remove user:password@ from api.base_url in settings.json (or "
                               "TAOTOKEN_BASE_URL): the key in api.api_key_env authenticates; a proxy's credentials "
                               "go in HTTPS_PROXY")
        self.timeout = float(timeout)
        self.policy = policy or RetryPolicy(max_retries=max_retries)
        self.max_concurrency = max(1, int(max_concurrency))
        self._limit = asyncio.Semaphore(self.max_concurrency)
        self.controller = controller
        self.trust_env = (not self.base.is_loopback) if trust_env is None else trust_env
        self._transport = transport
        self._http: httpx.AsyncClient | None = None

    @classmethod
    def from_channel(cls, channel: Channel, **kw) -> ProviderClient:
        """Build from `resolve_channel(...)`: base URL, key, default headers, timeout and max_retries. A
        `base_url` (e.g. the already-normalised one) must have the channel's origin: the key goes nowhere else."""
        kw.setdefault("timeout", channel.timeout_seconds)
        kw.setdefault("policy", RetryPolicy(max_retries=channel.max_retries))
        own = normalize_base_url(channel.base_url)
        base = kw.pop("base_url", None) or own
        base = base if isinstance(base, BaseURL) else normalize_base_url(base)
        if base.origin != own.origin:
            raise BaseURLError(scrub(base.url), "foreign_origin", "the key is sent only to the configured base "
                               f"URL ({scrub(own.url)})", "change api.base_url in settings.json (or "
                               "TAOTOKEN_BASE_URL) to move the channel; no argument can redirect the key")
        return cls(base, channel.key, headers=channel.headers, **kw)

    def __repr__(self) -> str:
        key = self._key.redacted if self._key else "<no key>"
        return f"ProviderClient({scrub(self.base.url)!r}, key={key})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def _secrets(self) -> tuple:
        """What no error or result may show: the key, credential-named header values, base-URL credentials."""
        return ((self._key,) if self._key else ()) + self._credentials

    def _new_client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
        try:
            return httpx.AsyncClient(timeout=timeout, trust_env=self.trust_env, transport=self._transport,
                                     follow_redirects=False, verify=_SSL.get(self.trust_env, True))
        except (ImportError, ValueError) as e:
            raise APIConnectionError(f"cannot use the proxy from the environment: {e}", kind="proxy_config",
                                     exc_type=type(e).__name__, url=self.base.url, secrets=self._secrets) from None

    def _slot(self):
        """The concurrency slot of one attempt: the controller's (adaptive), else the fixed semaphore."""
        return self.controller.slot() if self.controller is not None else _semaphore_slot(self._limit)

    def _request_headers(self, auth: bool, url: str) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **self._headers}
        if auth and self._key is not None:
            if not self.base.owns(url):
                raise APIConnectionError(f"refused to send the key to {scrub(url)}: it goes only to "
                                         f"{scrub(self.base.url)}", kind="foreign_origin", url=scrub(url))
            raw = self._key.reveal()
            bad = raw != raw.strip() or any(ord(c) < 32 or ord(c) > 126 for c in raw)
            if bad:
                raise KeyFormatError("the API key contains whitespace, a line break or non-ASCII characters "
                                     f"({self._key.redacted}); it was not sent", url=self.base.url)
            headers["Authorization"] = f"Bearer {raw}"
        return headers

    async def _send(self, method: str, url: str, *, payload: Any, auth: bool, model: str | None,
                    accept_sse: bool = False) -> httpx.Response:
        """One HTTP attempt, streamed; non-2xx raises the typed error (the body is read and closed)."""
        headers = self._request_headers(auth, url)
        if accept_sse:
            headers["Accept"] = "text/event-stream"
        kw = {"url": scrub(url), "model": model, "secrets": self._secrets}
        client = self._http or await _off_loop_client(self)
        try:
            req = client.build_request(method, url, json=payload, headers=headers)
            resp = await client.send(req, stream=True)
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{type(e).__name__}: no response within {self.timeout:g}s ({e})",
                                  exc_type=type(e).__name__, **kw) from None
        except httpx.HTTPError as e:
            text = exception_text(e)
            kind = "proxy" if isinstance(e, httpx.ProxyError) else classify_network_text(text) or "connect"
            raise APIConnectionError(text, kind=kind, exc_type=type(e).__name__, **kw) from None
        if resp.status_code >= 300:
            try:
                body = (await _read_capped(resp, MAX_ERROR_BODY_BYTES))[0].decode("utf-8", "replace")
            except httpx.HTTPError:
                body = ""
            finally:
                await resp.aclose()
            info = parse_error_body(body, self._secrets)
            raise status_error(resp.status_code, info, body=body, headers=resp.headers, **kw)
        return resp

    async def list_models(self, *, auth: bool = True, retry: bool = True) -> ModelList:
        """`GET <base>/models` → ids. `auth=False` sends no key (to see whether the server enforces one)."""
        url = self.base.endpoint("models")
        calls = 0

        async def once() -> ModelList:
            nonlocal calls
            calls += 1
            t0 = time.perf_counter()
            async with self._slot():
                resp = await self._send("GET", url, payload=None, auth=auth, model=None)
                try:
                    data = await self._json(resp, url)
                finally:
                    await resp.aclose()
            ids = [str(m.get("id")) for m in (data.get("data") or data.get("models") or [])
                   if isinstance(m, dict) and m.get("id")] if isinstance(data, dict) else []
            return ModelList(ids=ids, status=resp.status_code, latency_s=time.perf_counter() - t0,
                             attempts=calls, auth_sent=auth and self._key is not None,
                             rate_limit_headers=rate_limit_headers(resp.headers, secrets=self._secrets))

        policy = self.policy if retry else RetryPolicy(max_retries=0)
        return await call_with_retry(once, policy, what=f"GET {scrub(url)}", on_retry=self._on_retry)

    async def _json(self, resp: httpx.Response, url: str, model: str | None = None) -> Any:
        """The JSON body, every string in it scrubbed of the key; an error body, non-JSON or a body over
        `MAX_RESPONSE_BYTES` raises."""
        raw, over = await _read_capped(resp, MAX_RESPONSE_BYTES)
        kw = {"url": scrub(url), "model": model, "secrets": self._secrets, "headers": resp.headers}
        if over:
            raise BadResponseError(f"HTTP {resp.status_code} with a body over {MAX_RESPONSE_BYTES // 2**20} MiB "
                                   "(the most this client reads); ask for less: lower max_tokens or n",
                                   kind="too_large", body=raw[:4096].decode("utf-8", "replace"), **kw)
        try:
            text = raw.decode(json.detect_encoding(raw))
            kind, value = await off_loop("decode_body", text, plain(self._secrets), size=len(text))
        except UnicodeDecodeError:
            text, kind = raw.decode("utf-8", "replace"), "not_json"
        if kind == "json":
            return value
        if kind == "not_json":
            raise BadResponseError(f"HTTP {resp.status_code} but the body is not JSON: {text[:200]!r}",
                                   kind="not_json", body=text, **kw)
        info = ErrorInfo.model_validate(value) if value else None
        raise BadResponseError(f"HTTP {resp.status_code} with an error body: {info.short() if info else ''}",
                               info=info, body=text, **kw)

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, model: str, stream: bool = False,
                   temperature: float | None = None, max_tokens: int | None = None,
                   on_delta: Callable[[str], None] | None = None, **extra: Any) -> ChatResult:
        """`POST <base>/chat/completions`, retried by the table; SSE when `stream`."""
        url = self.base.endpoint("chat/completions")
        payload: dict[str, Any] = {"model": model, "messages": list(messages), "stream": bool(stream)}
        if temperature is not None:
            payload["temperature"] = temperature
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        payload.update(extra)
        calls, start = 0, time.perf_counter()

        async def once() -> ChatResult:
            nonlocal calls
            calls += 1
            async with self._slot() as attempt:
                result = await self._chat_once(url, payload, model, stream, on_delta)
                if attempt is not None:
                    attempt.usage = result.usage
                return result

        result = await call_with_retry(once, self.policy, what=f"POST {scrub(url)} model={model}",
                                       on_retry=self._on_retry)
        return result.model_copy(update={"attempts": calls, "elapsed_s": time.perf_counter() - start})

    @property
    def _on_retry(self):
        return self.controller.note_retry if self.controller is not None else None

    async def _chat_once(self, url: str, payload: dict, model: str, stream: bool, on_delta) -> ChatResult:
        t0 = time.perf_counter()
        resp = await self._send("POST", url, payload=payload, auth=True, model=model, accept_sse=stream)
        try:
            is_sse = "text/event-stream" in resp.headers.get("content-type", "")
            if stream and is_sse:
                st = await read_stream(resp, secrets=self._secrets, url=url, model=model, on_delta=on_delta)
                return ChatResult(model_requested=model, model_used=model, model_reported=st.model,
                                  content=st.text(), reasoning="".join(st.reasoning)[:MAX_ANSWER],
                                  finish_reason=st.finish_reason, choices=1 if st.choices_seen else 0,
                                  usage=st.usage, status=resp.status_code, latency_s=time.perf_counter() - t0,
                                  ttft_s=(st.first_token_at - t0) if st.first_token_at else None, streamed=True,
                                  rate_limit_headers=rate_limit_headers(resp.headers, secrets=self._secrets))
            data = await self._json(resp, url, model)
        finally:
            await resp.aclose()
        return _result_from_json(data, model, resp, time.perf_counter() - t0, self._secrets)

    async def chat_with_fallback(self, messages: Sequence[Mapping[str, Any]], *, model: str,
                                 fallback: str | None, **kw: Any) -> ChatResult:
        """`chat` with `model`; if it is unavailable, once more with `fallback` (noted in the result)."""
        try:
            return await self.chat(messages, model=model, **kw)
        except ProviderError as e:
            if not fallback or fallback == model or not is_model_unavailable(e):
                raise
            reason = f"{model}: {e.short()}"
            log.warning("model %s unavailable (%s); falling back to %s", model, e.short(), fallback)
        try:
            result = await self.chat(messages, model=fallback, **kw)
        except ProviderError as e2:
            e2.notes_.append(f"the reasoning model failed first: {reason}")
            raise
        return result.model_copy(update={"model_requested": model, "model_used": fallback,
                                         "fallback_from": model, "fallback_reason": reason})

    async def sample(self, messages: Sequence[Mapping[str, Any]], n: int, *, model: str,
                     **kw: Any) -> list[ChatResult | ProviderError]:
        """`n` samples of one prompt (group sampling), at most `max_concurrency` in flight (or the controller's
        adaptive limit). For many prompts in the background, use `worker.ProviderWorker`."""
        async def one() -> ChatResult | ProviderError:
            try:
                return await self.chat(messages, model=model, **kw)
            except ProviderError as e:
                return e
        return list(await asyncio.gather(*(one() for _ in range(n))))


_SSL: dict[bool, ssl.SSLContext] = {}
"""One TLS context per trust_env setting, shared by every client of this process: loading the CA bundle
takes ~0.1 s of CPU (over half a second on a busy machine)."""


async def _off_loop_client(pc: ProviderClient) -> httpx.AsyncClient:
    """`pc`'s HTTP client, made in a thread the first time: loading the CA bundle (once per process, then
    shared) and httpx's first imports would otherwise stall the event loop, and every other request with it."""
    if pc.trust_env not in _SSL:
        ctx = await asyncio.to_thread(httpx.create_ssl_context, trust_env=pc.trust_env)
        _SSL.setdefault(pc.trust_env, ctx)
    if pc._http is None:
        http = await asyncio.to_thread(pc._new_client)
        if pc._http is None:  # a concurrent first request may have made one meanwhile
            pc._http = http
        else:
            await http.aclose()
    return pc._http


async def _read_capped(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more (not read)."""
    buf = bytearray()
    async for part in resp.aiter_bytes():
        buf += part
        if len(buf) > limit:
            return bytes(buf[:limit]), True
    return bytes(buf), False


@asynccontextmanager
async def _semaphore_slot(sem: asyncio.Semaphore) -> AsyncIterator[Attempt | None]:
    async with sem:
        yield None


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)[:MAX_ANSWER]


def _result_from_json(data: Any, model: str, resp: httpx.Response, latency: float, secrets=()) -> ChatResult:
    """A completion body (already scrubbed by `_json`) as a `ChatResult`."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choices = choices if isinstance(choices, list) else []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = first.get("message") or {}
    content = _content(message) if message else str(first.get("text") or "")[:MAX_ANSWER]
    reasoning = str(message.get("reasoning_content") or message.get("reasoning") or "")[:MAX_ANSWER]
    return ChatResult(model_requested=model, model_used=model, model_reported=data.get("model"),
                      content=content, reasoning=reasoning, finish_reason=first.get("finish_reason"),
                      choices=len(choices), usage=data.get("usage") if isinstance(data.get("usage"), dict)
                      else None, status=resp.status_code, latency_s=latency, streamed=False,
                      rate_limit_headers=rate_limit_headers(resp.headers, secrets=secrets))


def safe_error_text(exc: BaseException, key: Secret | None = None, limit: int = 500) -> str:
    """Any exception as scrubbed, bounded text (for errors that are not ProviderError)."""
    return safe_text(exception_text(exc), limit, (key,) if key else ())
