"""Accuracy of a policy on a task: greedy accuracy and sampled avg@k, overall and per difficulty bucket.

Used by the trainer's held-out evaluation and by the built-in models' warm-start. Sampling runs under a
forked, seeded RNG so that evaluating (or not) never changes the caller's random stream. Does not log or
checkpoint.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vapo_engine.metrics import accuracies
from vapo_engine.prompts import PromptFormat

from .generate import generate, response_lengths, sample


def scores(policy, tokenizer, task, problems, *, max_new_tokens: int, greedy: bool = True,
           temperature: float = 1.0, top_p: float = 1.0, batch_size: int | None = 256,
           prompt_format: PromptFormat | None = None):
    """Per-problem rewards of one response each (greedy, or sampled at `temperature`) and the generation."""
    gen = generate(policy, tokenizer, [p.prompt for p in problems], max_new_tokens=max_new_tokens,
                   temperature=temperature, top_p=top_p, do_sample=not greedy, batch_size=batch_size,
                   prompt_format=prompt_format)
    return _rewards(task, problems, gen), gen


def _rewards(task, problems, gen) -> list[float]:
    return [task.reward(t, p.answer) for t, p in zip(gen.texts, problems)]


def _run_scores(models, task, problems, *, greedy: bool = True, **how):
    """`scores` of `models.policy`, sampled by the run's rollout backend (`models.backend`)."""
    gen = sample(models, [p.prompt for p in problems], do_sample=not greedy, **how)
    return _rewards(task, problems, gen), gen


@dataclass(frozen=True)
class Split:
    """Evaluate across ranks in lock-step (a sharded model: every forward is a collective): rank `rank` of
    `size` scores one equal slice and `sum` (an all-reduce SUM of a tensor) assembles the full result."""

    rank: int
    size: int
    sum: Callable[[torch.Tensor], torch.Tensor]


def evaluate(models, task, *, num_problems: int, samples_per_problem: int, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, batch_size: int = 256,
             prompt_format: PromptFormat | None = None, split: Split | None = None) -> dict[str, float]:
    """Held-out greedy accuracy and sampled avg@k (k = samples_per_problem) of `models.policy`, the prompts
    encoded in `prompt_format` (None = plain); with `split`, this rank's slice (every rank gets the result)."""
    problems = task.heldout(num_problems)
    if not problems:
        return {}
    common = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "prompt_format": prompt_format}
    rewards, lengths = _scored(models, task, problems, split, common)
    out = accuracies("greedy", task, problems, rewards)
    out["eval/response_length"] = sum(lengths) / len(lengths)
    if samples_per_problem > 0 and temperature > 0:  # seeded apart: the caller's random stream is untouched
        many = [p for p in problems for _ in range(samples_per_problem)]
        rewards, _ = _scored(models, task, many, split, common, greedy=False, temperature=temperature,
                             top_p=top_p, seed=seed + (split.rank if split else 0))
        out |= accuracies("sampled", task, many, rewards)
    return out


def _scored(models, task, problems, split: Split | None, common: dict, **how) -> tuple[list[float], list[float]]:
    """(rewards, response lengths) of every problem; with `split`, this rank scores an equal slice (the list
    padded with copies of the first problem so every rank runs the same batches) and the ranks' parts are summed."""
    if split is None:
        rewards, gen = _run_scores(models, task, problems, **common, **how)
        return rewards, response_lengths(gen.response_mask).float().tolist()
    n = len(problems)
    per = -(-n // split.size)
    padded = problems + [problems[0]] * (per * split.size - n)
    lo = split.rank * per
    rewards, gen = _run_scores(models, task, padded[lo:lo + per], **common, **how)
    full = torch.zeros(2, per * split.size, dtype=torch.float64)
    full[0, lo:lo + per] = torch.tensor(rewards, dtype=torch.float64)
    full[1, lo:lo + per] = response_lengths(gen.response_mask).double().cpu()
    full = split.sum(full).cpu()
    return full[0, :n].tolist(), full[1, :n].tolist()
