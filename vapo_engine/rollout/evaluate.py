"""Accuracy of a policy on a task: greedy accuracy and sampled avg@k, overall and per difficulty bucket.

Used by the trainer's held-out evaluation and by the built-in models' warm-start. Sampling runs under a
forked, seeded RNG so that evaluating (or not) never changes the caller's random stream. `on_sampled` sees the
sampled held-out responses as a Rollout (the trainer measures its critic on them). A run evaluates with its own
episode (rollout/episodes.py: with tools when it trains with them) and verifier (a response counts when the
verifier says it is correct); a multi-turn episode adds eval/greedy_tool_calls (calls per problem). Does not
log or checkpoint.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from vapo_engine.metrics import accuracies
from vapo_engine.prompts import PromptFormat
from vapo_engine.tasks.verifiers import Judge, make_judge

from .experience import Rollout, from_generation
from .generate import generate, response_lengths

OnSampled = Callable[[Rollout, "Callable[[torch.Tensor], torch.Tensor]"], dict[str, float]]
"""Extra metrics from the sampled held-out responses: called with this rank's rows (scored, no old outputs; rows
that only pad a rank's slice have an all-zero response mask) and a function that sums a tensor over the ranks
that share the evaluation (the identity for one)."""


def scores(policy, tokenizer, task, problems, *, max_new_tokens: int, greedy: bool = True,
           temperature: float = 1.0, top_p: float = 1.0, batch_size: int | None = 256,
           prompt_format: PromptFormat | None = None):
    """Per-problem rewards of one response each (greedy, or sampled at `temperature`) and the generation."""
    gen = generate(policy, tokenizer, [p.prompt for p in problems], max_new_tokens=max_new_tokens,
                   temperature=temperature, top_p=top_p, do_sample=not greedy, batch_size=batch_size,
                   prompt_format=prompt_format)
    return [float(v.correct) for v in make_judge("", task)(gen.texts, problems)], gen


def _run_scores(models, task, problems, *, greedy: bool = True, episode=None, judge: Judge | None = None, **how):
    """Per-problem correctness (1.0 / 0.0), verdicts and the generation of `models.policy`: one `episode` each
    (None: a single turn of the run's rollout backend, `models.backend`), judged by `judge` (None: the task's
    default verifier)."""
    from .episodes import SINGLE_TURN
    gen = (episode or SINGLE_TURN).sample(models, [p.prompt for p in problems], do_sample=not greedy, **how)
    verdicts = (judge or make_judge("", task))(gen.texts, problems)
    return [float(v.correct) for v in verdicts], verdicts, gen


@dataclass(frozen=True)
class Split:
    """Evaluate across ranks in lock-step (a sharded model: every forward is a collective): rank `rank` of
    `size` scores one equal slice and `sum` (an all-reduce SUM of a tensor) assembles the full result."""

    rank: int
    size: int
    sum: Callable[[torch.Tensor], torch.Tensor]


def evaluate(models, task, *, num_problems: int, samples_per_problem: int, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, batch_size: int = 256,
             prompt_format: PromptFormat | None = None, split: Split | None = None,
             on_sampled: OnSampled | None = None, episode=None, judge: Judge | None = None) -> dict[str, float]:
    """Held-out greedy accuracy and sampled avg@k (k = samples_per_problem) of `models.policy`, the prompts
    encoded in `prompt_format` (None = plain), each response one `episode` (None: single turn) judged by `judge`
    (None: the task's default verifier); with `split`, this rank's slice (every rank gets the result); with
    `on_sampled`, its metrics of the sampled responses too."""
    problems = task.heldout(num_problems)
    if not problems:
        return {}
    common = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "prompt_format": prompt_format,
              "episode": episode, "judge": judge}
    rewards, lengths, mine = _scored(models, task, problems, split, common)
    out = accuracies("greedy", task, problems, rewards)
    out["eval/response_length"] = sum(lengths) / len(lengths)
    if mine[0].tool_calls is not None:
        calls = (split.sum if split else (lambda t: t))(mine[0].tool_calls[:mine[2]].sum().double().cpu())
        out["eval/greedy_tool_calls"] = float(calls) / len(problems)
    if samples_per_problem > 0 and temperature > 0:  # seeded apart: the caller's random stream is untouched
        many = [p for p in problems for _ in range(samples_per_problem)]
        rewards, _, mine = _scored(models, task, many, split, common, greedy=False, temperature=temperature,
                                   top_p=top_p, seed=seed + (split.rank if split else 0))
        out |= accuracies("sampled", task, many, rewards)
        if on_sampled is not None:
            gen, verdicts, valid = mine
            ro = from_generation(gen, verdicts, models.device, temperature=temperature)
            if valid < ro.size:  # padding rows keep their place (lock-step forwards) but count for nothing
                keep = (torch.arange(ro.size) < valid).to(ro.response_mask)[:, None]
                ro = replace(ro, response_mask=ro.response_mask * keep, loss_mask=ro.loss_mask * keep)
            out |= on_sampled(ro, split.sum if split else (lambda t: t))
    return out


def _scored(models, task, problems, split: Split | None, common: dict, **how):
    """(rewards, response lengths) of every problem, and this rank's (generation, rewards, rows that are not
    padding); with `split`, this rank scores an equal slice (the list padded with copies of the first problem
    so every rank runs the same batches) and the ranks' parts are summed."""
    if split is None:
        rewards, verdicts, gen = _run_scores(models, task, problems, **common, **how)
        return rewards, response_lengths(gen.response_mask).float().tolist(), (gen, verdicts, len(rewards))
    n = len(problems)
    per = -(-n // split.size)
    padded = problems + [problems[0]] * (per * split.size - n)
    lo = split.rank * per
    rewards, verdicts, gen = _run_scores(models, task, padded[lo:lo + per], **common, **how)
    full = torch.zeros(2, per * split.size, dtype=torch.float64)
    full[0, lo:lo + per] = torch.tensor(rewards, dtype=torch.float64)
    full[1, lo:lo + per] = response_lengths(gen.response_mask).double().cpu()
    full = split.sum(full).cpu()
    return full[0, :n].tolist(), full[1, :n].tolist(), (gen, verdicts, max(0, min(per, n - lo)))
