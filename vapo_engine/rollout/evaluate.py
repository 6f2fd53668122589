"""Accuracy of a policy on a task: greedy accuracy and sampled avg@k, overall and per difficulty bucket.

Used by the trainer's held-out evaluation and by the built-in models' warm-start. Sampling runs under a
forked, seeded RNG so that evaluating (or not) never changes the caller's random stream. Does not log or
checkpoint.
"""
from __future__ import annotations

import torch

from vapo_engine.metrics import accuracies
from vapo_engine.prompts import PromptFormat

from .generate import generate, response_lengths


def scores(policy, tokenizer, task, problems, *, max_new_tokens: int, greedy: bool = True,
           temperature: float = 1.0, top_p: float = 1.0, batch_size: int | None = 256,
           prompt_format: PromptFormat | None = None):
    """Per-problem rewards of one response each (greedy, or sampled at `temperature`) and the generation."""
    gen = generate(policy, tokenizer, [p.prompt for p in problems], max_new_tokens=max_new_tokens,
                   temperature=temperature, top_p=top_p, do_sample=not greedy, batch_size=batch_size,
                   prompt_format=prompt_format)
    return [task.reward(t, p.answer) for t, p in zip(gen.texts, problems)], gen


def evaluate(models, task, *, num_problems: int, samples_per_problem: int, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, batch_size: int = 256,
             prompt_format: PromptFormat | None = None) -> dict[str, float]:
    """Held-out greedy accuracy and sampled avg@k (k = samples_per_problem) of `models.policy`, the prompts
    encoded in `prompt_format` (None = plain)."""
    problems = task.heldout(num_problems)
    if not problems:
        return {}
    common = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "prompt_format": prompt_format}
    rewards, greedy = scores(models.policy, models.tokenizer, task, problems, **common)
    out = accuracies("greedy", task, problems, rewards)
    out["eval/response_length"] = float(response_lengths(greedy.response_mask).float().mean())
    if samples_per_problem > 0 and temperature > 0:
        devices = [models.device] if models.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            many = [p for p in problems for _ in range(samples_per_problem)]
            rewards, _ = scores(models.policy, models.tokenizer, task, many, greedy=False,
                                temperature=temperature, top_p=top_p, **common)
        out |= accuracies("sampled", task, many, rewards)
    return out
