"""`smoke_test`: ask the channel a reasoning question with a known answer and judge the reply (docs/design.md §4).

Default: "A train travels 240 km in 3 hours. What is its average speed?" with a math-reasoning system
prompt, temperature 0.2, max_tokens 256; the answer must contain 80 (as a number, not inside 180 or 800).
Streams when `runtime.stream` is true; falls back to `models.fallback` when the reasoning model is
unavailable. A failure always says why: HTTP error, an error body in a 200, empty choices, an empty answer,
`finish_reason: length` before any answer, a broken stream, or a wrong answer.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from vapo_engine.config import Channel
from vapo_engine.diagnostics import Diagnosis, Evidence, channel_facts, diagnose, error_facts
from vapo_engine.providers import ChatResult, ProviderClient, ProviderError, RetryPolicy, safe_text

from .channel_support import Progress, load_channel, report_progress, scrubbed

log = logging.getLogger("tools.smoke")
DEFAULT_QUESTION = "A train travels 240 km in 3 hours. What is its average speed?"
DEFAULT_EXPECT = "80"
SYSTEM_PROMPT = ("You are a careful math reasoning assistant. Think step by step, then give the final answer "
                 "as a number with its unit on the last line.")


class SmokeResult(BaseModel):
    """Result of `smoke_test`: pass/fail with the evidence."""

    passed: bool
    reason: str
    http_code: str = "000"
    status: int | None = None
    model_requested: str
    model_used: str | None = None
    fallback_used: bool = False
    fallback_reason: str | None = None
    streamed: bool = False
    question: str
    expected: str
    answer_excerpt: str = ""
    reasoning_excerpt: str = ""
    finish_reason: str | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    usage: dict[str, Any] | None = None
    attempts: int = 1
    error: dict[str, Any] | None = None
    diagnosis: Diagnosis | None = None
    evidence: list[str] = Field(default_factory=list)


def contains_answer(text: str, expected: str) -> bool:
    """Numbers match as numbers (80, 80.0, 80 km/h, \\boxed{80}; not 180 or 800); other text case-insensitively."""
    exp = expected.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", exp):
        num = exp.rstrip("0").rstrip(".") if "." in exp else exp
        tail = r"0*(?!\d)" if "." in num else r"(?:\.0+)?(?!\.?\d)"
        return re.search(rf"(?<![\d.]){re.escape(num)}{tail}", text.replace(",", "")) is not None
    return exp.lower() in text.lower()


def judge(result: ChatResult, expected: str) -> tuple[bool, str]:
    """Pass/fail of a completed call, with the reason."""
    answer = result.content.strip()
    if result.choices == 0:
        return False, "HTTP 200 but the response has no choices"
    if not answer and result.finish_reason == "length":
        return False, ("finish_reason is 'length' and there is no answer: max_tokens was used up "
                       + ("while reasoning" if result.reasoning else "before any content") + "; raise max_tokens")
    if not answer:
        return False, f"empty answer (finish_reason: {result.finish_reason})"
    if contains_answer(answer, expected):
        return True, f"answer contains {expected!r}"
    if result.finish_reason == "length":
        return False, f"answer cut off at max_tokens (finish_reason: length) without {expected!r}"
    return False, f"wrong answer: expected it to contain {expected!r}"


class _Progress:
    """Sync or async progress callback; streaming deltas are reported at most every 10%."""

    def __init__(self, cb: Progress | None, max_chars: int):
        self.cb, self.max_chars, self.chars, self.last, self.pending = cb, max(1, max_chars), 0, 0.0, []

    async def __call__(self, fraction: float, message: str) -> None:
        await report_progress(self.cb, fraction, message)

    def delta(self, piece: str) -> None:
        self.chars += len(piece)
        frac = 0.2 + 0.7 * min(1.0, self.chars / self.max_chars)
        if self.cb is None or frac - self.last < 0.1:
            return
        self.last = frac
        try:
            out = self.cb(frac, f"streaming: {self.chars} characters")
            if hasattr(out, "__await__"):
                import asyncio
                self.pending.append(asyncio.ensure_future(out))
        except Exception as e:  # noqa: BLE001 - progress is best-effort
            log.debug("progress callback failed: %s", e)


async def smoke_test(channel: Channel | None = None, *, settings_path: str | Path = "settings.json",
                     config_path: str | Path | None = "config.toml", env: Mapping[str, str] | None = None,
                     prompt: str | None = None, expect: str | None = None, model: str | None = None,
                     stream: bool | None = None, system_prompt: str | None = SYSTEM_PROMPT,
                     temperature: float = 0.2, max_tokens: int = 256, policy: RetryPolicy | None = None,
                     on_progress: Progress | None = None, client: ProviderClient | None = None) -> SmokeResult:
    """Ask the question, judge the answer; never raises for channel problems (they are the result)."""
    channel = channel or load_channel(settings_path, config_path, env)
    question, expected = (prompt or DEFAULT_QUESTION)[:4000], (expect or DEFAULT_EXPECT)[:200]
    model = model or channel.reasoning_model
    stream = channel.stream if stream is None else stream
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
        [{"role": "user", "content": question}]
    progress = _Progress(on_progress, max_tokens * 4)
    await progress(0.05, "channel resolved")
    own = client is None
    base = {"question": question, "expected": expected, "model_requested": model, "streamed": stream}
    secrets = channel.secrets()
    try:
        client = client or ProviderClient.from_channel(channel, **({"policy": policy} if policy else {}))
        await progress(0.15, f"asking {model}" + (" (streaming)" if stream else ""))
        result = await client.chat_with_fallback(messages, model=model, fallback=channel.fallback_model,
                                                 stream=stream, temperature=temperature, max_tokens=max_tokens,
                                                 on_delta=progress.delta)
    except ProviderError as e:
        out = _failed(channel, e, base, env)
    except ValueError as e:  # an unusable base URL
        out = SmokeResult(passed=False, reason=f"cannot call the API: {safe_text(e, 300, secrets)}",
                          diagnosis=_diagnosis(channel, None, env), **base)
    else:
        out = _judged(channel, result, base)
    finally:
        if own and client is not None:
            await client.aclose()
    for task in progress.pending:
        await task
    await progress(1.0, "passed" if out.passed else "failed")
    return scrubbed(out, channel)


def _judged(channel: Channel, r: ChatResult, base: dict) -> SmokeResult:
    secrets = channel.secrets()
    passed, reason = judge(r, base["expected"])
    evidence = [f"HTTP {r.status} from {r.model_used}" + (f" (fallback from {r.fallback_from})"
                                                          if r.fallback_from else ""),
                f"finish_reason: {r.finish_reason}", f"{r.attempts} attempt(s)"]
    return SmokeResult(
        passed=passed, reason=reason, http_code=str(r.status), status=r.status, model_used=r.model_used,
        fallback_used=r.fallback_from is not None, fallback_reason=r.fallback_reason,
        answer_excerpt=safe_text(r.content.strip(), 600, secrets),
        reasoning_excerpt=safe_text(r.reasoning.strip(), 300, secrets), finish_reason=r.finish_reason,
        latency_ms=r.elapsed_s * 1000, ttft_ms=r.ttft_s * 1000 if r.ttft_s is not None else None,
        usage=r.usage, attempts=r.attempts, evidence=evidence, **{**base, "streamed": r.streamed})


def _diagnosis(channel: Channel, e: ProviderError | None, env) -> Diagnosis:
    fields: dict[str, Any] = channel_facts(channel, os.environ if env is None else env)
    if e is not None:
        fields.update({k: v for k, v in error_facts(e).items() if v not in (None, {}, "")})
    fields["inputs"] = ["channel", "smoke call"]
    return diagnose(Evidence(**fields))


def _failed(channel: Channel, e: ProviderError, base: dict, env) -> SmokeResult:
    diagnosis = _diagnosis(channel, e, env)
    top = diagnosis.findings[0] if diagnosis.findings else None
    reason = e.short() + (f" — {top.title}" if top else "")
    evidence = [*e.notes_[:3], *([e.gave_up] if e.gave_up else [])]
    return SmokeResult(passed=False, reason=reason[:600], http_code=str(e.status) if e.status else "000",
                       status=e.status, model_used=None, error=e.summary(), diagnosis=diagnosis,
                       attempts=e.attempts, answer_excerpt=getattr(e, "partial", "")[:600],
                       evidence=evidence, **base)


def smoke_test_sync(*args: Any, **kw: Any) -> SmokeResult:
    """`smoke_test` for synchronous callers (the CLI)."""
    return anyio.run(lambda: smoke_test(*args, **kw))
