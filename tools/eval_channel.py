"""Evaluation through the API channel: each held-out problem asked greedily (temperature 0) once, and
`samples` more times at the run's temperature / top_p for avg@k, with bounded concurrency, through the
project's provider client (the configured base URL only, the same retry table, redaction and fallback as
`check_channel` and `smoke_test`). Requests are plain JSON (not streamed), so every answer carries `usage`.

The prompt is the task's problem text as the user message, exactly the text the run's evaluation feeds the
policy; a task that defines `system_prompt` (the format instruction that makes a provider's answers
checkable) gets it as a system message. A served checkpoint without a chat template ignores it.

A failure that will not go away by itself (401/403, a model that does not exist even after the fallback,
quota exhausted, a server that cannot be reached) stops the evaluation early instead of sending every
remaining request; calls still running at the deadline are cancelled and counted as failures of kind
`deadline`. Torch-free.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from vapo_engine.config import Channel
from vapo_engine.providers import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    KeyFormatError,
    NotFoundError,
    PermissionDeniedError,
    ProviderClient,
    ProviderError,
    RateLimitError,
)
from vapo_engine.tasks.verifiers import make_judge

FATAL = (AuthenticationError, PermissionDeniedError, NotFoundError, KeyFormatError)


@dataclass
class Call:
    """One request's outcome."""

    reward: float = 0.0
    ok: bool = False
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_used: str | None = None
    error_kind: str | None = None
    error: str | None = None


@dataclass
class ChannelRun:
    greedy: list[Call]
    sampled: list[Call]
    complete: bool
    stopped_early: str | None = None
    seconds: float = 0.0


def _fatal(e: ProviderError) -> bool:
    """Errors every further request would meet too (after the client's own retries and the fallback)."""
    unreachable = isinstance(e, APIConnectionError) and not isinstance(e, APITimeoutError)
    return isinstance(e, FATAL) or unreachable or (isinstance(e, RateLimitError) and e.quota_exhausted)


def _messages(task, problem) -> list[dict]:
    system = getattr(task, "system_prompt", None)
    user = [{"role": "user", "content": problem.prompt}]
    return ([{"role": "system", "content": system}] if system else []) + user


async def run_channel(channel: Channel, task, problems: list, *, model: str, fallback: str | None,
                      max_tokens: int, temperature: float, top_p: float, samples: int, concurrency: int = 8,
                      deadline_s: float = 3600.0, client: ProviderClient | None = None,
                      on_progress: Callable[[int, int], Awaitable[None]] | None = None,
                      on_request: Callable[[], None] | None = None) -> ChannelRun:
    """Greedy + sampled calls for `problems`; never raises for channel failures (they are in the result).
    `concurrency` workers take the calls in order, so memory does not grow with their number; `on_request` is
    called as each request is sent (the server's request budget, tools.eval_gate)."""
    jobs = [(p, 0.0, None) for p in problems]
    if samples > 0 and temperature > 0:
        jobs += [(p, temperature, top_p) for p in problems for _ in range(samples)]
    results: list[Call | None] = [None] * len(jobs)
    state = {"done": 0, "stop": None, "next": 0}
    own = client is None
    client = client or ProviderClient.from_channel(channel, max_concurrency=max(1, concurrency))
    t0 = time.perf_counter()

    async def worker(scope: anyio.CancelScope) -> None:
        while state["stop"] is None and (i := state["next"]) < len(jobs):
            state["next"] += 1
            problem, temp, tp = jobs[i]
            if on_request:
                on_request()
            results[i] = await _call(client, task, problem, model, fallback, max_tokens, temp, tp)
            if results[i].error_kind and state["stop"] is None and results[i].error_kind.startswith("fatal:"):
                state["stop"] = results[i].error
                scope.cancel()
            state["done"] += 1
            if on_progress:
                await on_progress(state["done"], len(jobs))

    try:
        with anyio.move_on_after(deadline_s) as deadline:
            async with anyio.create_task_group() as tg:
                for _ in range(min(max(1, concurrency), len(jobs))):
                    tg.start_soon(worker, tg.cancel_scope)
    finally:
        if own:
            await client.aclose()
    missing = Call(error_kind="cancelled" if state["stop"] else "deadline",
                   error="cancelled or not sent: the evaluation stopped early" if state["stop"] else
                   f"no answer within the {deadline_s:g} s deadline")
    filled = [r if r is not None else missing for r in results]
    n = len(problems)
    return ChannelRun(filled[:n], filled[n:], complete=not deadline.cancelled_caught and not state["stop"],
                      stopped_early=state["stop"], seconds=time.perf_counter() - t0)


async def _call(client: ProviderClient, task, problem, model: str, fallback: str | None, max_tokens: int,
                temperature: float, top_p: float | None) -> Call:
    extra = {"top_p": top_p} if top_p is not None and top_p < 1.0 else {}
    try:
        r = await client.chat_with_fallback(_messages(task, problem), model=model, fallback=fallback, stream=False,
                                            temperature=temperature, max_tokens=max_tokens, **extra)
    except ProviderError as e:
        kind = e.kind or type(e).__name__
        return Call(error_kind=("fatal:" if _fatal(e) else "") + kind, error=e.short()[:300])
    u = r.usage or {}
    verdict = make_judge("", task)([r.content], [problem])[0]  # "correct" as a run decides it (tasks/verifiers.py)
    return Call(reward=float(verdict.correct), ok=True, latency_s=r.elapsed_s,
                prompt_tokens=int(u.get("prompt_tokens") or 0),
                completion_tokens=int(u.get("completion_tokens") or 0), model_used=r.model_used)
