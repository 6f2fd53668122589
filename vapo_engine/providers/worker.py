"""Provider requests for a training loop: an async batch API and a background thread that never blocks its caller.

The trainer runs torch in its main thread; provider samples must never stall a step (docs/design.md §8). So:

    worker = ProviderWorker(channel, concurrency=ConcurrencyPolicy(start=8), max_pending=64,
                            explain=partial(explain_provider_down, channel=channel)).start()
    worker.submit([ProviderRequest(id="p17", messages=[...], n=8, meta={"answer": "42"})])  # returns at once
    ...
    for s in worker.drain():          # whatever finished since the last call, at once
        if s.ok: check s.content against s.meta, tokenize, add to the replay buffer
    worker.stats().metrics()          # provider/* numbers to log; worker.down says why it stopped (with the fix)
    worker.stop()

`submit` takes a request only while fewer than `max_pending` are unfinished (else it is dropped and counted: the
caller simply submits again next step); after the provider is down nothing is taken (counted as skipped). Every
accepted request yields exactly `n` samples, ok or failed with the reason. The thread owns its event loop and its
`ProviderClient` (built from the channel alone, so the key only goes to the channel's base URL); the client's
`ConcurrencyController` does the 429 handling (shared Retry-After cool-down, AIMD limit) and the counting.

`run_requests(client, requests, …)` is the same work for async code that already has a loop (evaluation).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field
from typing_extensions import Self

from vapo_engine.config import Channel

from .client import ProviderClient
from .errors import ProviderError
from .pool import (
    ConcurrencyController,
    ConcurrencyPolicy,
    ProviderDown,
    ProviderDownError,
    ProviderStats,
    down_kind,
    plain_down,
)
from .redaction import safe_text
from .retry import RetryPolicy

log = logging.getLogger("vapo_engine.providers")
Explain = Callable[[ProviderError, str], ProviderDown]
"""`explain(error, kind)` → the verdict with the channel's fix (`vapo_engine.diagnostics.explain_provider_down`)."""
_KEEP = object()


class ProviderRequest(BaseModel):
    """One prompt to sample `n` answers for; `meta` travels to every sample (e.g. the task's answer)."""

    id: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(1, ge=1, le=256)
    meta: dict[str, Any] = Field(default_factory=dict)


class ProviderSample(BaseModel):
    """One answer (or the reason there is none). Text is scrubbed of the key by the client."""

    request_id: str
    index: int
    ok: bool
    content: str = ""
    finish_reason: str | None = None
    model_used: str | None = None
    fallback_from: str | None = None
    usage: dict[str, Any] | None = None
    latency_s: float = 0.0
    attempts: int = 0
    status: int | None = None
    error: str | None = None
    error_kind: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


def _mark_down_if_fatal(ctl: ConcurrencyController, exc: ProviderError, explain: Explain | None) -> None:
    """After a failed call: stop sending when it is a 'provider down' failure (or too many in a row)."""
    kind = down_kind(exc) or ("failing" if ctl.failing() else None)
    if kind is None or ctl.down is not None:
        return
    try:
        verdict = explain(exc, kind) if explain is not None else plain_down(exc, kind)
    except Exception as e:  # noqa: BLE001 - the verdict's wording must not hide the verdict
        log.debug("explaining the provider failure failed: %s", e)
        verdict = plain_down(exc, kind)
    ctl.mark_down(verdict)
    log.warning("%s", verdict.line())


async def sample_once(client: ProviderClient, req: ProviderRequest, index: int, *, model: str,
                      fallback: str | None = None, explain: Explain | None = None,
                      **chat_kw: Any) -> ProviderSample:
    """One answer of `req` through `client` (fallback as usual); failures become a failed sample, and a
    'provider down' failure marks the client's controller down."""
    ctl, t0 = client.controller, time.perf_counter()
    base: dict[str, Any] = {"request_id": req.id, "index": index, "meta": req.meta}
    try:
        r = await client.chat_with_fallback(req.messages, model=model, fallback=fallback, **chat_kw)
    except ProviderDownError as e:
        if ctl is not None:
            ctl.count(skipped=1)
        return ProviderSample(ok=False, error=e.down.line(), error_kind="provider_down", **base)
    except ProviderError as e:
        if ctl is not None:
            ctl.record_call(False)
            _mark_down_if_fatal(ctl, e, explain)
        return ProviderSample(ok=False, error=e.short()[:500], error_kind=e.kind, status=e.status,
                              attempts=e.attempts, latency_s=time.perf_counter() - t0, **base)
    if ctl is not None:
        ctl.record_call(True)
    return ProviderSample(ok=True, content=r.content, finish_reason=r.finish_reason, model_used=r.model_used,
                          fallback_from=r.fallback_from, usage=r.usage, latency_s=r.elapsed_s,
                          attempts=r.attempts, status=r.status, **base)


async def run_requests(client: ProviderClient, requests: Iterable[ProviderRequest], *, model: str,
                       fallback: str | None = None, explain: Explain | None = None,
                       **chat_kw: Any) -> list[ProviderSample]:
    """Every sample of `requests`, in order (request, then index). Concurrency is the client's: give it a
    `ConcurrencyController` for bursts. Never raises for provider failures."""
    jobs = [sample_once(client, r, i, model=model, fallback=fallback, explain=explain, **chat_kw)
            for r in requests for i in range(r.n)]
    return list(await asyncio.gather(*jobs))


class ProviderWorker:
    """Provider requests in a daemon thread with its own event loop; `submit`, `drain`, `stats` never block."""

    def __init__(self, channel: Channel, *, model: str | None = None, fallback: Any = _KEEP,
                 concurrency: ConcurrencyPolicy | None = None, retry: RetryPolicy | None = None,
                 max_pending: int = 64, max_results: int = 4096, explain: Explain | None = None,
                 chat_kw: Mapping[str, Any] | None = None, name: str = "vapo-provider"):
        if max_pending < 1 or max_results < 1:
            raise ValueError("max_pending and max_results must be at least 1")
        self.channel = channel
        self.model = model or channel.reasoning_model
        self.fallback = channel.fallback_model if fallback is _KEEP else fallback
        self.controller = ConcurrencyController(concurrency)
        self.retry, self.explain = retry, explain
        self.max_pending, self.max_results = max_pending, max_results
        self.chat_kw = {"stream": False, **(chat_kw or {})}
        self._inbox: deque[ProviderRequest] = deque()
        self._outbox: deque[ProviderSample] = deque()
        self._pending = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # --- the caller's side (any thread; nothing here waits) ------------------------------------------------

    def start(self) -> Self:
        if not self._thread.is_alive() and not self._stopping.is_set():
            self._thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def submit(self, requests: Iterable[ProviderRequest | Mapping[str, Any]]) -> int:
        """Queue requests without waiting; returns how many were taken. A full queue drops (counted as
        `dropped`); a down or stopped provider skips (counted as `skipped`, in samples)."""
        items = [r if isinstance(r, ProviderRequest) else ProviderRequest.model_validate(r) for r in requests]
        taken = dropped = skipped = 0
        with self._lock:
            for r in items:
                if self.controller.down is not None or self._stopping.is_set():
                    skipped += r.n
                elif self._pending >= self.max_pending:
                    dropped += 1
                else:
                    self._inbox.append(r)
                    self._pending += 1
                    taken += 1
            loop, kick = self._loop, self._kick
        self.controller.count(dropped=dropped, skipped=skipped)
        if taken and loop is not None and kick is not None:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:  # the loop closed meanwhile (stopping)
                pass
        return taken

    def drain(self, max_items: int | None = None) -> list[ProviderSample]:
        """The samples finished since the last call (at most `max_items`), oldest first."""
        with self._lock:
            n = len(self._outbox) if max_items is None else min(max_items, len(self._outbox))
            return [self._outbox.popleft() for _ in range(n)]

    def stats(self) -> ProviderStats:
        return self.controller.stats()

    @property
    def down(self) -> ProviderDown | None:
        """Why the provider is no longer used (with the fix), or None."""
        return self.controller.down

    @property
    def pending(self) -> int:
        """Requests taken whose samples are not all finished."""
        with self._lock:
            return self._pending

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is in flight and end the thread (waits at most `timeout` seconds for it)."""
        self._stopping.set()
        with self._lock:
            loop, kick = self._loop, self._kick
        if loop is not None and kick is not None:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as e:  # a thread must report, not die silently
            secrets = self.channel.secrets()
            reason = safe_text(f"{type(e).__name__}: {e}", 300, secrets)
            self.controller.mark_down(ProviderDown(kind="failing", reason=f"the provider worker stopped: {reason}",
                                                   fix="see the worker log; restart the run to retry"))
            log.exception("provider worker crashed")

    async def _main(self) -> None:
        kick = asyncio.Event()
        with self._lock:
            self._loop, self._kick = asyncio.get_running_loop(), kick
        client = self._client()
        tasks: set[asyncio.Task] = set()
        try:
            while not self._stopping.is_set():
                for req in self._take():
                    task = asyncio.create_task(self._serve(client, req))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await kick.wait()
                kick.clear()
        finally:
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if client is not None:
                await client.aclose()
            with self._lock:
                self._loop = self._kick = None

    def _client(self) -> ProviderClient | None:
        """The channel's client with this worker's controller; an unusable base URL marks the provider down."""
        kw: dict[str, Any] = {"controller": self.controller}
        if self.retry is not None:
            kw["policy"] = self.retry
        try:
            return ProviderClient.from_channel(self.channel, **kw)
        except ValueError as e:
            self.controller.mark_down(ProviderDown(kind="base_url", reason=safe_text(str(e), 400),
                                                   fix=getattr(e, "fix", None) or "fix api.base_url in settings.json"))
            return None

    def _take(self) -> list[ProviderRequest]:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        return items

    async def _serve(self, client: ProviderClient | None, req: ProviderRequest) -> None:
        try:
            await asyncio.gather(*(self._one(client, req, i) for i in range(req.n)))
        finally:
            with self._lock:
                self._pending -= 1

    async def _one(self, client: ProviderClient | None, req: ProviderRequest, index: int) -> None:
        if client is None or self.controller.down is not None:
            down = self.controller.down
            self.controller.count(skipped=1)
            sample = ProviderSample(request_id=req.id, index=index, ok=False, meta=req.meta,
                                    error=down.line() if down else "provider unavailable",
                                    error_kind="provider_down")
        else:
            sample = await sample_once(client, req, index, model=self.model, fallback=self.fallback,
                                       explain=self.explain, **self.chat_kw)
        with self._lock:
            full = len(self._outbox) >= self.max_results
            if full:
                self._outbox.popleft()
            self._outbox.append(sample)
        if full:
            self.controller.count(results_dropped=1)
