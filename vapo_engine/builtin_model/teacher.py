"""Teachers for the chain model's warm-start phases: reference solutions with a deficit put in on purpose.

- `NoisyTeacher` (the default chain model, `build.RECIPES["builtin:chain"]`): every line of the reference
  copies its operation's sign wrong with probability `p` (independently; only where the wrong sign keeps every
  running total in 0–99), and the lines after it carry the wrong total on. A model fine-tuned on it learns the
  right sign as the likely one and the wrong one at about rate p per line: greedy answers are mostly right,
  sampled ones fail at random lines, more often the longer the chain — errors a token-level critic can see in
  the line where they are made, and that reward alone can train away.
- `StopEarlyTeacher` (the `builtin:chain@planted-stop` model): stops every chain after `lines` lines and
  answers the total so far. RL then only has to flip one decision at a fixed position (keep going after line
  8), which any policy-gradient method can do; kept for the "recovering a planted early stop" demo.
"""
from __future__ import annotations

import dataclasses
import random

from vapo_engine.tasks import Problem
from vapo_engine.tasks.answers import BUILTIN_ANSWER_MARK


class StopEarlyTeacher:
    """The task's problems with the stop-early teacher's responses and answers; checking and buckets are the
    task's own, so "accuracy" under this teacher is the share of answers given its way."""

    def __init__(self, task, lines: int):
        if not hasattr(task, "solve") or lines < 1:
            raise ValueError(f"a stop-early teacher needs builtin:chain and lines >= 1, not {task!r}, {lines}")
        self.task, self.lines = task, lines
        self.name, self.max_new_tokens = task.name, task.max_new_tokens

    def __repr__(self) -> str:
        return f"StopEarlyTeacher(a teacher that stops after {self.lines} lines)"

    def reference_solution(self, problem: Problem) -> str:
        return self.task.solve(problem.prompt, max_lines=self.lines)

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return [dataclasses.replace(p, answer=self.reference_solution(p).rsplit(BUILTIN_ANSWER_MARK, 1)[1])
                for p in self.task.train_batch(n, rng)]

    def bucket(self, problem: Problem) -> str:
        return self.task.bucket(problem)

    def reward(self, response: str, answer: str) -> float:
        return self.task.reward(response, answer)


class NoisyTeacher:
    """The task's problems with reference solutions whose lines copy the sign wrong with probability `p` each
    (see the module docstring); answers, checking and buckets are the task's own, so the validation accuracy of
    a phase on this teacher is true accuracy. Noise is drawn from its own seeded generator."""

    def __init__(self, task, p: float, seed: int = 0):
        if not hasattr(task, "legal_flip") or not 0 < p < 0.5:
            raise ValueError(f"a noisy teacher needs builtin:chain and 0 < p < 0.5, not {task!r}, {p}")
        self.task, self.p, self.rng = task, p, random.Random(seed)
        self.name, self.max_new_tokens = task.name, task.max_new_tokens

    def __repr__(self) -> str:
        return f"NoisyTeacher(p={self.p}: each line's sign copied wrong with probability {self.p})"

    def flips(self, prompt: str) -> frozenset[int]:
        """The lines whose sign this draw of the teacher copies wrong."""
        out: frozenset[int] = frozenset()
        for line in range(self.task.steps_of(prompt)):
            if self.rng.random() < self.p and self.task.legal_flip(prompt, out, line):
                out |= {line}
        return out

    def reference_solution(self, problem: Problem) -> str:
        return self.task.solve(problem.prompt, flips=self.flips(problem.prompt))

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return self.task.train_batch(n, rng)

    def bucket(self, problem: Problem) -> str:
        return self.task.bucket(problem)

    def reward(self, response: str, answer: str) -> float:
        return self.task.reward(response, answer)
