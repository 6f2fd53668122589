"""Adaptive concurrency for bursts of provider requests (group sampling sends `group_size` × prompts at once).

    controller = ConcurrencyController(ConcurrencyPolicy(start=8))
    client = ProviderClient.from_channel(channel, controller=controller)   # every attempt takes a slot
    ...
    async with controller.slot() as attempt:   # what the client does around each HTTP attempt
        ...
    controller.stats().metrics()               # {"provider/requests": …, "provider/concurrency": …, …}

What it does, and why:
- **A concurrency limit** (`start`, between `min` and `max`): at most that many attempts in flight.
- **A shared cool-down**: a response with `retry-after-ms` / `retry-after` (parsed by `errorbody`, the table
  `retry.py` uses) pauses *every new attempt* to the host until then, not only the one that got it — the other
  requests of the burst would hit the same limit.
- **AIMD**: `decrease_after` 429s (consecutive, or within `window_s` when successes come in between) halve the
  limit; only 429s of attempts started at the current limit count, so one burst answered with 429s halves it
  once, not down to 1 (as TCP cuts its window once per round trip). `increase_after` consecutive successes
  add 1, up to `max`.
- **Provider down**: `down_kind` names the failures after which sending more is pointless (401, 403, 404
  after the fallback, quota exhausted, a key that cannot be sent, a redirect, TLS/proxy set-up, or
  `down_after_failures` failed calls in a row); once `mark_down` is called every `slot()` raises
  `ProviderDownError`. The verdict's fix text comes from the diagnostics knowledge base
  (`vapo_engine.diagnostics.explain_provider_down`; injected, since diagnostics imports this package).

The state lives in one event loop (the one that runs the requests); `stats()` may be read from any thread.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .errorbody import is_quota_exhausted, retry_after_seconds
from .errors import (
    APIConnectionError,
    AuthenticationError,
    KeyFormatError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    ProviderError,
    RateLimitError,
    RedirectError,
)

HISTORY = 64
"""Limit changes kept for `limit_history()` (a log line or a test can show how the limit moved)."""
LATENCY_WINDOW = 2000
"""Latencies kept for the percentiles (the most recent successful attempts)."""
_SETUP_KINDS = frozenset({"tls", "tls_http", "proxy_config", "foreign_origin"})


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """Knobs of the controller. `max` defaults to `start` (the limit never grows above what was configured)."""

    start: int = 8
    max: int | None = None
    min: int = 1
    decrease_after: int = 2
    window_s: float = 10.0
    increase_after: int = 8
    cooldown_cap_s: float = 60.0
    """Longest shared pause honoured for one Retry-After (the per-request retry gives up beyond its own cap)."""
    down_after_failures: int = 16
    """Failed calls in a row (no success between) after which the provider counts as down; 0 = never."""

    def __post_init__(self) -> None:
        if self.min < 1 or self.start < self.min or (self.max is not None and self.max < self.start):
            raise ValueError(f"concurrency limits must satisfy 1 <= min ({self.min}) <= start ({self.start}) "
                             f"<= max ({self.max}): set them in that order")
        if self.decrease_after < 1 or self.increase_after < 1:
            raise ValueError("decrease_after and increase_after must be at least 1")

    @property
    def ceiling(self) -> int:
        return self.max if self.max is not None else self.start


class ProviderDown(BaseModel):
    """Why the provider stopped being used, with the channel's fix (shown in run status and diagnose_error)."""

    kind: str
    """auth | forbidden | not_found | quota | key_format | redirect | setup | failing | base_url"""
    reason: str
    status: int | None = None
    title: str | None = None
    fix: str
    rule_id: str | None = None

    def line(self) -> str:
        """One sentence for a status line or a log record."""
        return f"provider down ({self.kind}): {self.reason} — fix: {self.fix}"[:600]


class ProviderDownError(Exception):
    """Raised by `slot()` once the provider is marked down: nothing more is sent."""

    def __init__(self, down: ProviderDown):
        super().__init__(down.line())
        self.down = down


def down_kind(exc: BaseException) -> str | None:
    """The kind of 'stop sending' failure `exc` is (after retries and fallback), or None when it is transient or
    specific to one request (429 rate limit, 5xx, timeouts, a 400 for one prompt)."""
    if isinstance(exc, AuthenticationError):
        return "auth"
    if isinstance(exc, PaymentRequiredError) or (isinstance(exc, RateLimitError) and exc.quota_exhausted):
        return "quota"
    if isinstance(exc, PermissionDeniedError):
        return "quota" if is_quota_exhausted(exc.info, exc.body or "") else "forbidden"
    if isinstance(exc, NotFoundError):
        return "not_found"
    if isinstance(exc, KeyFormatError):
        return "key_format"
    if isinstance(exc, RedirectError):
        return "redirect"
    if isinstance(exc, APIConnectionError) and exc.kind in _SETUP_KINDS:
        return "setup"
    return None


def plain_down(exc: ProviderError, kind: str) -> ProviderDown:
    """A verdict without the knowledge base (used when no `explain` is given)."""
    return ProviderDown(kind=kind, reason=exc.short()[:400], status=exc.status,
                        fix="run `vapo-mcp check` and `vapo-mcp diagnose` on this error for the fix")


class ProviderStats(BaseModel):
    """A snapshot of the controller's counters; `metrics()` gives the `provider/*` names the trainer logs."""

    requests: int = 0
    """Calls (one request with its retries and fallback) that finished."""
    ok: int = 0
    failed: int = 0
    attempts: int = 0
    retries: int = 0
    rate_limited: int = 0
    """429 responses seen (every attempt)."""
    dropped: int = 0
    """Requests refused because the bounded queue was full (`ProviderWorker.submit`)."""
    skipped: int = 0
    """Samples not sent because the provider was down."""
    results_dropped: int = 0
    """Finished samples discarded because nobody drained the result buffer in time."""
    concurrency: int = 0
    concurrency_max: int = 0
    concurrency_low: int = 0
    """Lowest limit reached so far."""
    decreases: int = 0
    increases: int = 0
    in_flight: int = 0
    in_flight_peak: int = 0
    last_retry_after_s: float | None = None
    paused_s: float = 0.0
    """Seconds the shared cool-down still has to run."""
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    down: ProviderDown | None = None

    def metrics(self) -> dict[str, float]:
        """Numbers under `provider/…` (None values left out)."""
        names = {"requests": self.requests, "ok": self.ok, "failed": self.failed, "retries": self.retries,
                 "rate_limited": self.rate_limited, "dropped": self.dropped, "skipped": self.skipped,
                 "results_dropped": self.results_dropped,
                 "concurrency": self.concurrency, "concurrency_low": self.concurrency_low,
                 "in_flight_peak": self.in_flight_peak, "latency_p50_s": self.latency_p50_s,
                 "latency_p95_s": self.latency_p95_s, "prompt_tokens": self.prompt_tokens,
                 "completion_tokens": self.completion_tokens, "last_retry_after_s": self.last_retry_after_s,
                 "down": 1.0 if self.down else 0.0}
        return {f"provider/{k}": float(v) for k, v in names.items() if v is not None}


@dataclass
class Attempt:
    """One HTTP attempt holding a slot; the caller may set `usage` (the completion's usage) on success."""

    epoch: int
    started: float
    usage: dict[str, Any] | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class _Counters:
    calls_ok: int = 0
    calls_failed: int = 0
    fail_streak: int = 0
    attempts: int = 0
    retries: int = 0
    rate_limited: int = 0
    dropped: int = 0
    skipped: int = 0
    results_dropped: int = 0
    decreases: int = 0
    increases: int = 0
    in_flight_peak: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_retry_after: float | None = None
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


class ConcurrencyController:
    """The limit, the cool-down, AIMD and the counters (see the module docstring)."""

    def __init__(self, policy: ConcurrencyPolicy | None = None, *, clock: Callable[[], float] = time.monotonic):
        self.policy = policy or ConcurrencyPolicy()
        self._clock = clock
        self._limit = self._low = self.policy.start
        self._in_flight = 0
        self._epoch = 0
        self._ok_streak = 0
        self._strikes: list[float] = []
        self._paused_until = 0.0
        self._down: ProviderDown | None = None
        self._changed = asyncio.Event()
        self._lock = threading.Lock()
        self._c = _Counters()
        self._history: deque[tuple[float, int]] = deque([(clock(), self._limit)], maxlen=HISTORY)

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def down(self) -> ProviderDown | None:
        return self._down

    def _wake(self) -> None:
        """Wake every waiter (they re-check); a fresh event for the next wait."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _blocked_for(self) -> float | None:
        """None when an attempt may start now; else seconds to wait (inf: until something changes)."""
        pause = self._paused_until - self._clock()
        if pause > 0:
            return pause
        return None if self._in_flight < self._limit else math.inf

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Attempt]:
        """Hold one of the `limit` slots for one attempt; wait out a cool-down first. The outcome (success, or
        the `ProviderError` that leaves the block) feeds AIMD and the counters. Raises `ProviderDownError`."""
        while True:
            if self._down is not None:
                raise ProviderDownError(self._down)
            wait = self._blocked_for()
            if wait is None:
                break
            changed = self._changed
            if math.isinf(wait):
                await changed.wait()  # a slot frees, the limit grows, or the provider goes down
                continue
            try:
                await asyncio.wait_for(changed.wait(), wait)  # or the cool-down ends
            except asyncio.TimeoutError:
                pass
        attempt = self._begin()
        try:
            yield attempt
        except ProviderError as e:
            self._end(attempt, e)
            raise
        except BaseException:
            self._end(attempt, None, aborted=True)
            raise
        else:
            self._end(attempt, None)

    def _begin(self) -> Attempt:
        with self._lock:
            self._in_flight += 1
            self._c.attempts += 1
            self._c.in_flight_peak = max(self._c.in_flight_peak, self._in_flight)
        return Attempt(epoch=self._epoch, started=self._clock())

    def _end(self, attempt: Attempt, exc: ProviderError | None, aborted: bool = False) -> None:
        now = self._clock()
        with self._lock:
            self._in_flight -= 1
            if exc is None and not aborted:
                self._success(attempt, now)
            elif exc is not None:
                self._failure(attempt, exc, now)
        self._wake()

    def _success(self, attempt: Attempt, now: float) -> None:
        c = self._c
        c.latencies.append(now - attempt.started)
        usage = attempt.usage or {}
        c.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        c.completion_tokens += int(usage.get("completion_tokens") or 0)
        self._strikes = [t for t in self._strikes if now - t <= self.policy.window_s]
        self._ok_streak += 1
        if self._ok_streak >= self.policy.increase_after and self._limit < self.policy.ceiling:
            self._limit += 1
            self._ok_streak = 0
            c.increases += 1
            self._history.append((now, self._limit))

    def _failure(self, attempt: Attempt, exc: ProviderError, now: float) -> None:
        after = retry_after_seconds(exc.headers)
        if after is not None:
            self._c.last_retry_after = after
            self._paused_until = max(self._paused_until, now + min(after, self.policy.cooldown_cap_s))
        if not isinstance(exc, RateLimitError) or exc.quota_exhausted:
            return
        self._c.rate_limited += 1
        self._ok_streak = 0
        if attempt.epoch != self._epoch:
            return  # sent at an older limit: that limit was already cut
        self._strikes.append(now)
        if len(self._strikes) >= self.policy.decrease_after and self._limit > self.policy.min:
            self._limit = max(self.policy.min, self._limit // 2)
            self._low = min(self._low, self._limit)
            self._epoch += 1
            self._strikes = []
            self._c.decreases += 1
            self._history.append((now, self._limit))

    def note_retry(self, *_: Any) -> None:
        """Count one retry (the client's `on_retry` hook)."""
        with self._lock:
            self._c.retries += 1

    def record_call(self, ok: bool) -> None:
        """Count a finished call (a request with its retries and fallback), whoever made it."""
        with self._lock:
            c = self._c
            c.calls_ok += ok
            c.calls_failed += not ok
            c.fail_streak = 0 if ok else c.fail_streak + 1

    def failing(self) -> bool:
        """True after `down_after_failures` failed calls in a row (a provider that never answers usefully)."""
        n = self.policy.down_after_failures
        return n > 0 and self._c.fail_streak >= n

    def count(self, *, dropped: int = 0, skipped: int = 0, results_dropped: int = 0) -> None:
        """Count requests refused by a full queue, samples skipped while down, results nobody drained."""
        with self._lock:
            self._c.dropped += dropped
            self._c.skipped += skipped
            self._c.results_dropped += results_dropped

    def mark_down(self, down: ProviderDown) -> None:
        """Stop sending: every waiting and future `slot()` raises `ProviderDownError` (the first verdict stays)."""
        if self._down is None:
            self._down = down
        self._wake()

    def limit_history(self) -> list[tuple[float, int]]:
        """(clock time, limit) at the start and after every change, oldest first (the last `HISTORY`)."""
        with self._lock:
            return list(self._history)

    def stats(self) -> ProviderStats:
        """A consistent snapshot (any thread)."""
        with self._lock:
            c = self._c
            lat = list(c.latencies)
            return ProviderStats(
                requests=c.calls_ok + c.calls_failed, ok=c.calls_ok, failed=c.calls_failed, attempts=c.attempts,
                retries=c.retries, rate_limited=c.rate_limited, dropped=c.dropped, skipped=c.skipped,
                results_dropped=c.results_dropped,
                concurrency=self._limit, concurrency_max=self.policy.ceiling, concurrency_low=self._low,
                decreases=c.decreases, increases=c.increases, in_flight=self._in_flight,
                in_flight_peak=c.in_flight_peak, last_retry_after_s=c.last_retry_after,
                paused_s=max(0.0, self._paused_until - self._clock()), latency_p50_s=percentile(lat, 0.5),
                latency_p95_s=percentile(lat, 0.95), prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens, down=self._down)
