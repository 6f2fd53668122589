"""Held-out evaluation: greedy accuracy and sampled avg@k at the rollout temperature.

Sampling runs under a forked, step-seeded RNG so that evaluating (or not) never changes the training
random stream. Does not log or checkpoint.
"""
from __future__ import annotations

import torch

from vapo_engine.rollout.generate import generate, response_lengths


def evaluate(models, task, *, num_problems: int, samples_per_problem: int, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, batch_size: int = 256) -> dict[str, float]:
    problems = task.heldout(num_problems)
    if not problems:
        return {}
    prompts = [p.prompt for p in problems]
    greedy = generate(models.policy, models.tokenizer, prompts, max_new_tokens=max_new_tokens,
                      do_sample=False, batch_size=batch_size)
    g_acc = sum(task.reward(t, p.answer) for t, p in zip(greedy.texts, problems)) / len(problems)
    out = {"eval/greedy_accuracy": g_acc,
           "eval/response_length": float(response_lengths(greedy.response_mask).float().mean())}
    if samples_per_problem > 0 and temperature > 0:
        devices = [models.device] if models.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            many = [p for p in problems for _ in range(samples_per_problem)]
            sampled = generate(models.policy, models.tokenizer, [p.prompt for p in many],
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               do_sample=True, batch_size=batch_size)
        out["eval/sampled_accuracy"] = sum(task.reward(t, p.answer) for t, p in zip(sampled.texts, many)) / len(many)
    return out
