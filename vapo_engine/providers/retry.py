"""The retry policy as a decision table, run by tenacity.

| outcome                                         | retry? | wait                                              |
|-------------------------------------------------|--------|---------------------------------------------------|
| connection error (dns, refused, unreachable, protocol) | yes | exponential backoff with jitter              |
| timeout (connect / read / write / pool)          | yes    | backoff                                           |
| broken SSE stream (dropped mid-way, no `[DONE]`) | yes    | backoff (the whole request is sent again)         |
| TLS error, proxy misconfiguration                | no     | — (fails the same way every time)                 |
| HTTP 408, 409, 429, 5xx                          | yes    | `retry-after-ms`, else `retry-after`, else backoff |
| HTTP 429 quota / balance exhausted               | no     | — (waiting does not refill a quota)               |
| HTTP 400, 401, 402, 403, 404, 422, other 4xx     | never  | —                                                 |
| HTTP 3xx redirect                                | never  | — (not followed: the key stays with the base URL)  |
| 200 with an error body, not JSON, key format     | no     | —                                                 |
| `x-should-retry: true/false` (retryable statuses) | header wins |                                              |
| Retry-After longer than `retry_after_cap`        | no     | give up at once, saying why                       |

Backoff: `min(backoff_base · 2^(attempt−1), backoff_max) · (1 − jitter · U[0,1))`. At most `max_retries` retries
(config.toml `api.max_retries`), i.e. `max_retries + 1` attempts.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from .errorbody import retry_after_seconds
from .errors import ProviderError, RateLimitError

log = logging.getLogger("vapo_engine.providers")
T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 409, 429})
NEVER_RETRY_STATUSES = frozenset({400, 401, 402, 403, 404, 422})
RETRY_KINDS = frozenset({"dns", "refused", "unreachable", "connect", "protocol", "timeout", "stream_broken"})


@dataclass(frozen=True)
class RetryPolicy:
    """Knobs of the table above. Tests use small values (e.g. backoff_base=0.01)."""

    max_retries: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    jitter: float = 0.25
    retry_after_cap: float = 60.0
    rng: Callable[[], float] = field(default=random.random, repr=False, compare=False)


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    wait: float = 0.0


def backoff(policy: RetryPolicy, attempt: int) -> float:
    """Exponential backoff with jitter for the retry after `attempt` (1-based)."""
    delay = min(policy.backoff_base * 2 ** max(0, attempt - 1), policy.backoff_max)
    return max(0.0, delay * (1 - policy.jitter * policy.rng()))


def decide(exc: BaseException, attempt: int, policy: RetryPolicy) -> Decision:
    """Whether to retry after `exc` on attempt `attempt` (1-based), and how long to wait first."""
    if not isinstance(exc, ProviderError):
        return Decision(False, f"unexpected error {type(exc).__name__} (not retried)")
    if exc.status is None or exc.status == 200:
        if exc.kind in RETRY_KINDS:
            return Decision(True, f"{exc.kind} error", backoff(policy, attempt))
        return Decision(False, f"{exc.kind} errors are not retried")
    status = exc.status
    if 300 <= status < 400:
        return Decision(False, f"HTTP {status} redirect: not followed, so the key never leaves the base URL")
    if status in NEVER_RETRY_STATUSES:
        return Decision(False, f"HTTP {status} is never retried")
    if isinstance(exc, RateLimitError) and exc.quota_exhausted:
        return Decision(False, "quota/balance exhausted: waiting will not help")
    retryable = status in RETRY_STATUSES or status >= 500
    should = (exc.headers.get("x-should-retry") or "").lower()
    if should in ("true", "false"):
        retryable = should == "true"
    if not retryable:
        return Decision(False, f"HTTP {status} is not retried")
    after = retry_after_seconds(exc.headers)
    if after is not None and after > policy.retry_after_cap:
        return Decision(False, f"server asked to retry after {after:g}s, more than the cap of "
                               f"{policy.retry_after_cap:g}s: gave up")
    if after is not None:
        return Decision(True, f"HTTP {status}, honouring Retry-After {after:g}s", after)
    return Decision(True, f"HTTP {status}", backoff(policy, attempt))


async def call_with_retry(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *, what: str = "request",
                          on_retry: Callable[[int, Decision, ProviderError], None] | None = None) -> T:
    """Run `fn` under the table; the raised error carries `attempts` and, if it was not retried, `gave_up`."""
    decisions: dict[int, Decision] = {}

    def should_retry(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        if exc is None:
            return False
        d = decide(exc, state.attempt_number, policy)
        decisions[state.attempt_number] = d
        if isinstance(exc, ProviderError):
            exc.attempts = state.attempt_number
            if not d.retry:
                exc.gave_up = d.reason
            elif state.attempt_number > policy.max_retries:
                exc.gave_up = f"gave up after {state.attempt_number} attempts ({d.reason})"
        return d.retry

    def wait(state: RetryCallState) -> float:
        return decisions[state.attempt_number].wait

    def before_sleep(state: RetryCallState) -> None:
        d, exc = decisions[state.attempt_number], state.outcome.exception()
        log.warning("%s: %s; retry %d/%d in %.2fs (%s)", what, exc.short() if isinstance(exc, ProviderError)
                    else type(exc).__name__, state.attempt_number, policy.max_retries, d.wait, d.reason)
        if on_retry and isinstance(exc, ProviderError):
            on_retry(state.attempt_number, d, exc)

    retrying = AsyncRetrying(stop=stop_after_attempt(policy.max_retries + 1), retry=should_retry, wait=wait,
                             before_sleep=before_sleep, sleep=anyio.sleep, reraise=True)
    async for attempt in retrying:
        with attempt:
            return await fn()
    raise AssertionError("unreachable")  # pragma: no cover
