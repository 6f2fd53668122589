"""A teacher whose chains of thought stop short: `builtin:chain` solved for at most `lines` lines.

The last warm-start phase of the chain model trains on it (see `build.RECIPES`): the model has learnt to
solve chains of every length, then learns from this teacher to stop long ones after `lines` lines and answer
the total so far, as a model fine-tuned on short chains of thought stops reasoning early. RL then has one
thing to fix on the long end, which reward can teach (keep going), instead of a skill the model lacks.
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

    def reference_solution(self, problem: Problem) -> str:
        return self.task.solve(problem.prompt, max_lines=self.lines)

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return [dataclasses.replace(p, answer=self.reference_solution(p).rsplit(BUILTIN_ANSWER_MARK, 1)[1])
                for p in self.task.train_batch(n, rng)]

    def bucket(self, problem: Problem) -> str:
        return self.task.bucket(problem)

    def reward(self, response: str, answer: str) -> float:
        return self.task.reward(response, answer)
