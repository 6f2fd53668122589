"""The critic's measures: explained variance that means the same thing in every run, and the stopping rule of
value pretraining (the pretraining rounds themselves are in loop.py).

Value pretraining (docs/design.md §3.5) stops at `value_pretrain_steps` rounds, or earlier when the held-out EV has not
improved by `value_pretrain_min_delta` for `value_pretrain_patience` rounds (`plateaued`). EV is also logged by
position inside the response (quarters) and by response length (`ev_breakdown`), so a critic that only learns
the end of answers, or only short ones, shows.

`critic/explained_var` is always measured against Monte-Carlo returns, whatever targets the critic trains on
(λ_critic, or λ_policy without Decoupled-GAE), so the column compares across ablation rows; EV against the
training targets is `critic/explained_var_targets`. Undefined EV (constant returns) is omitted, never logged.
Both are measured on a fresh rollout before the critic trains on it, from training prompts. On held-out prompts,
each evaluation measures the critic on the evaluation's sampled responses (`heldout_ev`): `eval/critic_ev` over
every response token, `eval/critic_ev_start` of V(s_0) alone (the value of the prompt: its predicted chance of
success) against the rewards.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

import torch

from vapo_engine.algo import ev_from_stats, ev_stats, within_ev_from_stats, within_group_ev_stats
from vapo_engine.rollout.experience import response_values, value_log_probs

from .advantages import monte_carlo_returns

SumRanks = Callable[[torch.Tensor], torch.Tensor]
"""A tensor summed over ranks (`Parallel.sum`; the identity for one process)."""

VALUE_ONLY = "value_pretrain"
"""run.json `mode` of a `vapo-mcp pretrain-value` run: value pretraining only, then the value model is saved."""
LENGTH_BUCKETS = (("short", 0, 48), ("mid", 49, 120), ("long", 121, 10**9))
"""Response length (tokens) buckets of the EV breakdown."""


def explained_var(name: str, values, targets, mask, reduce_sum: SumRanks) -> dict[str, float]:
    """{name: EV} from global statistics over the valid tokens of `mask` (`reduce_sum` adds them over ranks);
    {} when undefined."""
    ev = float(ev_from_stats(reduce_sum(ev_stats(values, targets, mask))))
    return {name: ev} if math.isfinite(ev) else {}


def within_explained_var(name: str, values, targets, mask, group_size: int, reduce_sum: SumRanks
                         ) -> dict[str, float]:
    """{name: EV within prompt groups} (each group of `group_size` consecutive rows centred on its own mean:
    what a per-prompt baseline leaves to explain), from global statistics; {} when undefined or without groups
    (group_size < 2, or rows that do not split into whole groups)."""
    if group_size < 2 or values.shape[0] % group_size:
        return {}
    ev = float(within_ev_from_stats(reduce_sum(within_group_ev_stats(values, targets, mask, group_size))))
    return {name: ev} if math.isfinite(ev) else {}


def mc_explained_var(ro, reduce_sum: SumRanks, group_size: int = 1, name: str = "critic/explained_var"
                     ) -> dict[str, float]:
    """EV of the rollout's old values against Monte-Carlo returns (λ = 1: the sequence reward everywhere),
    overall and within prompt groups (`<name>_within_prompt`), and the returns' variance over the valid tokens
    (`critic/return_var`): with both, EV pools over steps as 1 − Σ (1 − EV)·var / Σ var instead of averaging
    ratios."""
    if ro.values is None:
        return {}
    mc = monte_carlo_returns(ro).returns
    st = reduce_sum(ev_stats(ro.values, mc, ro.loss_mask))
    ev, n = float(ev_from_stats(st)), float(st[0].clamp(min=1))
    var = float(st[2] / n - (st[1] / n) ** 2)
    within = within_explained_var(f"{name}_within_prompt", ro.values, mc, ro.loss_mask, group_size, reduce_sum)
    return ({name: ev} if math.isfinite(ev) else {}) | within | {"critic/return_var": max(var, 0.0)}


def heldout_ev(models, micro_batch: int, group_size: int = 1):
    """The `on_sampled` hook of the held-out evaluation (rollout.evaluate): the critic's EV on the sampled
    held-out responses against their Monte-Carlo returns, over all response tokens and at the first one, and
    within each problem's `group_size` samples (`eval/critic_ev_within_prompt`; pass 1 where a rank's slice may
    cut a problem's samples apart)."""
    def measure(ro, reduce_sum: SumRanks) -> dict[str, float]:
        with torch.no_grad(), models.autocast():
            parts = [ro.rows(slice(s, s + micro_batch)) for s in range(0, ro.size, micro_batch)]
            values = torch.cat([response_values(models.value, mb, value_log_probs(models, mb)) for mb in parts])
        mc = monte_carlo_returns(replace(ro, values=values)).returns
        first = torch.zeros_like(ro.loss_mask)
        first[:, 0] = ro.loss_mask[:, 0]
        return (explained_var("eval/critic_ev", values, mc, ro.loss_mask, reduce_sum)
                | explained_var("eval/critic_ev_start", values, mc, first, reduce_sum)
                | within_explained_var("eval/critic_ev_within_prompt", values, mc, ro.loss_mask, group_size,
                                       reduce_sum))
    return measure


def ev_breakdown(ro, reduce_sum: SumRanks, prefix: str) -> dict[str, float]:
    """EV against the rollout's returns by position quarter of the response and by response length."""
    mask = ro.loss_mask
    lengths = mask.sum(1, keepdim=True).clamp(min=1)
    pos = (mask.cumsum(1) - 1).clamp(min=0) / lengths  # 0 … <1 over each response
    out = {}
    for q in range(4):
        sel = mask * ((pos >= q / 4) & (pos < (q + 1) / 4)).to(mask.dtype)
        out |= explained_var(f"{prefix}ev_pos_q{q + 1}", ro.values, ro.returns, sel, reduce_sum)
    for name, lo, hi in LENGTH_BUCKETS:
        sel = mask * ((lengths >= lo) & (lengths <= hi)).to(mask.dtype)
        out |= explained_var(f"{prefix}ev_len_{name}", ro.values, ro.returns, sel, reduce_sum)
    return out


def plateaued(hist: list[float], k: int, min_delta: float) -> bool:
    """Whether the last k values (their median; undefined values skipped) fail to beat every earlier k-window's
    median by min_delta. Needs 2k values. Windows and medians, not single rounds: one round's EV comes from one
    small fresh rollout and is noisy (on builtin:chain with 64 samples it jumped from 0.35 to -0.47 between
    rounds of a rising critic), and a zero-init head sits at EV 0 for its first rounds — comparing single rounds
    stopped pretraining on noise."""
    def median(xs: list[float]) -> float:
        ok = [x for x in xs if not math.isnan(x)]
        return statistics.median(ok) if ok else float("-inf")
    if len(hist) < 2 * k:
        return False
    best_before = max(median(hist[i:i + k]) for i in range(len(hist) - 2 * k + 1))
    return median(hist[-k:]) < best_before + min_delta
