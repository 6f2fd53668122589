"""Verifiers: what scores a response and decides whether it is correct (docs/design.md §3.14).

A verifier is a class with a `name` and `check(response, problem) -> float`, the score of one response in
[0, 1]; `VERIFIERS` registers it by name (`data.verifier`; empty = the task's own default, `Task.verifier`).
`verify(verifier, responses, problems, timeout_s=...)` scores a batch and returns one `Verdict(score, correct)`
per response: each check runs under its own timeout (a check that does not return in time scores 0, is not
correct, and is counted: `Verdict.timed_out`); a check that raises scores 0 too. **Correct is decided here and
nowhere else**: `judged(score)` — full credit, score ≥ 1 — is what every caller reads (`Rollout.correct`, the
positive replay, provider samples, the doctor's round trip, evaluation accuracy).

Timeouts run each batch in a daemon worker thread; a check still running at its deadline is abandoned (Python
cannot stop a thread) and the rest of the batch goes to a fresh worker, so a verifier that hangs costs its
timeout and one idle thread, never the run. Torch-free (the config checker lists the names).

Adding a verifier: a class in a file of its own under vapo_engine/tasks/ (one file) and its line in `VERIFIERS`
(one line).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from vapo_engine.registry import Registry

from .answers import answers_match, builtin_answer_correct
from .base import Problem

FULL_CREDIT = 1.0
"""A response is correct when its score reaches this (`judged`)."""


@dataclass(frozen=True)
class Verdict:
    """One response's score and whether it is correct (always `judged(score)`)."""

    score: float
    correct: bool
    timed_out: bool = False


def judged(score: float, *, timed_out: bool = False) -> Verdict:
    """The one place a score becomes "correct": full credit (score ≥ FULL_CREDIT)."""
    score = float(score)
    return Verdict(score, score >= FULL_CREDIT, timed_out)


class Verifier(Protocol):
    name: str

    def check(self, response: str, problem: Problem) -> float:
        """The score of `response` to `problem` in [0, 1] (1 = full credit)."""
        ...


class ExactVerifier:
    """Built-in tasks: the text after the last `;` equals the gold answer exactly (`answers.builtin_answer_correct`)."""

    name = "exact"

    def check(self, response: str, problem: Problem) -> float:
        return 1.0 if builtin_answer_correct(response, problem.answer) else 0.0


class MathVerifier:
    """AIME-style sets: the last `\\boxed{}` (else the last number) against the gold answer, exact rationals,
    then math-verify's symbolic equivalence (`answers.answers_match`)."""

    name = "math"

    def check(self, response: str, problem: Problem) -> float:
        return 1.0 if answers_match(response, problem.answer) else 0.0


class TaskVerifier:
    """A task's own `reward(response, answer)` (for a task that brings its checker and names no verifier)."""

    name = "task"

    def __init__(self, task):
        self.task = task

    def check(self, response: str, problem: Problem) -> float:
        return float(self.task.reward(response, problem.answer))


VERIFIERS = Registry("verifier", field="data.verifier", entries={
    "exact": ExactVerifier,
    "math": MathVerifier,
    "task": TaskVerifier,
})


def make_verifier(name: str, task) -> Verifier:
    """The verifier `name` (empty: the task's default, `task.verifier`, else its own reward), built for `task`."""
    name = name or getattr(task, "verifier", "") or "task"
    cls = VERIFIERS.lookup(name)
    return cls(task) if cls is TaskVerifier else cls()


@dataclass(frozen=True)
class Judge:
    """A verifier with its timeout: `judge(responses, problems)` → one Verdict each (what a run scores with)."""

    verifier: Verifier
    timeout_s: float = 10.0

    def __call__(self, responses: Sequence[str], problems: Sequence[Problem]) -> list[Verdict]:
        return verify(self.verifier, responses, problems, timeout_s=self.timeout_s)


def make_judge(name: str, task, timeout_s: float = 10.0) -> Judge:
    """`Judge(make_verifier(name, task), timeout_s)`: data.verifier / data.verifier_timeout_s for `task`."""
    return Judge(make_verifier(name, task), timeout_s)


def verify(verifier: Verifier, responses: Sequence[str], problems: Sequence[Problem], *,
           timeout_s: float = 10.0) -> list[Verdict]:
    """One `Verdict` per response (`responses[i]` answers `problems[i]`); each check bounded by `timeout_s`."""
    if len(responses) != len(problems):
        raise ValueError(f"{len(responses)} responses for {len(problems)} problems")
    out: list[Verdict | None] = [None] * len(responses)
    start = 0
    while start < len(responses):
        start = _run_from(verifier, responses, problems, out, start, timeout_s)
    return [v for v in out if v is not None]


def _run_from(verifier: Verifier, responses, problems, out: list, start: int, timeout_s: float) -> int:
    """Check items start… in one worker thread; returns where to go on (past an item that timed out, or the end)."""
    done = threading.Condition()
    progress = [start]  # the item the worker is on

    def work() -> None:
        for i in range(start, len(responses)):
            try:
                verdict = judged(verifier.check(responses[i], problems[i]))
            except Exception:  # noqa: BLE001 - a verifier that raises on odd model output scores 0, never a crash
                verdict = judged(0.0)
            with done:
                if progress[0] != i:  # abandoned: the caller moved on after this item's deadline
                    return
                out[i] = verdict
                progress[0] = i + 1
                done.notify()
    threading.Thread(target=work, name=f"verifier-{verifier.name}", daemon=True).start()
    with done:
        while progress[0] < len(responses):
            i, deadline = progress[0], time.monotonic() + timeout_s
            while progress[0] == i and time.monotonic() < deadline:
                done.wait(max(deadline - time.monotonic(), 0.0))
            if progress[0] == i:  # item i hung: score it 0 and go on without this worker
                out[i] = judged(0.0, timed_out=True)
                progress[0] = -1
                return i + 1
    return len(responses)
