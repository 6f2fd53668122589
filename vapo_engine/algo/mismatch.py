"""Sampler/trainer log-prob mismatch: token-level truncated (or masked) importance sampling, and its statistics.

When the tokens were drawn by another copy of the policy than the one the trainer holds (an inference server
with its own kernels and precision, or a snapshot of older weights sampling while the trainer updates), the
sampler's distribution μ and the trainer's recomputed old policy π_old differ. The PPO ratio π_θ / π_old is
then taken on samples that are not from π_old; the importance weight w_t = π_old(y_t) / μ(y_t) =
exp(log π_old − log μ) per token corrects that (the "decoupled" PPO objective: behaviour policy μ, proximal
policy π_old). Unbounded weights have unbounded variance, so they are bounded, token by token, at a cap C:

- ``truncate`` (TIS, truncated importance sampling): w = min(ratio, C). Only the upper side is bounded; a
  token the sampler over-weighted (ratio < 1) keeps its small weight. Every token stays in the loss and in
  its denominator. This is what verl calls ``rollout_is_mode = "truncate"`` (formerly
  ``tis_imp_ratio_cap``) and what TRL/ms-swift call token-level truncated IS.
- ``mask`` (masked IS, "IcePop"-style rejection): tokens whose ratio lies outside [1/C, C] get weight 0 (no
  gradient from them) and the others keep their ratio; the lower bound is the reciprocal of the cap, as in
  verl when no separate lower threshold is set. Masked tokens stay in the loss's token denominator (the
  global token count does not change between modes, so the gradient scale of the surviving tokens is that of
  ``truncate``).
- ``off``: w = 1 (the statistics are still useful as a diagnostic).

The weights are constants (no gradient flows through them); they multiply the per-token policy-gradient
loss only, never the value loss, the KL penalty or the positive-example NLL. Because the clipped surrogate
max(−Aρ, −A·clip(ρ)) (and its dual-clip bound) is positively homogeneous in A, w·L(ρ, A) = L(ρ, w·A) for w ≥ 0:
the trainer applies them by scaling the advantages of each token (`weighted_advantages`).

Shapes: every tensor (B, T), right-padded, with a bool/float response mask. Pads never enter a weight or a
statistic (they get weight 0). No config objects, no distributed calls: the statistics come as all-reducible
sums (`mismatch_sums`) and a max, finished by `mismatch_metrics`.
"""
from __future__ import annotations

import torch

from .stats import as_bool_mask

Tensor = torch.Tensor

IS_MODES = ("truncate", "mask", "off")
_LOG_RATIO_LIMIT = 20.0  # exp(±20) is finite in fp32; larger log-ratios carry no information after capping


def importance_weights(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor, *, cap: float = 2.0,
                       mode: str = "truncate") -> tuple[Tensor, Tensor]:
    """Per-token importance weights π_old / μ, bounded as `mode` says (see the module docstring).

    Shapes: trainer_log_probs (B, T) log π_old of the sampled tokens, sampler_log_probs (B, T) log μ of the same
    tokens as the sampler reported them, mask (B, T) -> (weights (B, T) float32, detached, 0 at pads;
    bounded (B, T) bool: valid tokens whose raw ratio was truncated (``truncate``) or masked (``mask``)).
    `cap` C > 1; ``mask`` keeps ratios in [1/C, C].
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; valid modes: {', '.join(IS_MODES)}")
    if not cap > 1:
        raise ValueError(f"the importance-weight cap must be > 1, got {cap}")
    if trainer_log_probs.shape != sampler_log_probs.shape:
        raise ValueError(f"trainer log-probs {tuple(trainer_log_probs.shape)} and sampler log-probs "
                         f"{tuple(sampler_log_probs.shape)} differ in shape")
    m = as_bool_mask(mask, trainer_log_probs)
    zero = torch.zeros((), dtype=torch.float32, device=trainer_log_probs.device)
    log_ratio = torch.where(m, trainer_log_probs.detach().float() - sampler_log_probs.detach().float(), zero)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))
    if mode == "off":
        return torch.where(m, torch.ones_like(ratio), zero), torch.zeros_like(m)
    if mode == "truncate":
        bounded = m & (ratio > cap)
        return torch.where(m, ratio.clamp(max=cap), zero), bounded
    bounded = m & ((ratio > cap) | (ratio < 1.0 / cap))
    return torch.where(m & ~bounded, ratio, zero), bounded


def weighted_advantages(advantages: Tensor, weights: Tensor | None) -> Tensor:
    """The advantages the policy loss sees: `advantages` × `weights` (the weights ≥ 0 and detached), or the
    advantages themselves when there are no weights (the same tensor, so nothing changes)."""
    return advantages if weights is None else advantages * weights.to(advantages.dtype)


def mismatch_sums(trainer_log_probs: Tensor, sampler_log_probs: Tensor, weights: Tensor, bounded: Tensor,
                  mask: Tensor) -> tuple[Tensor, Tensor]:
    """All-reducible statistics of one batch: (sums float64 [Σ|Δ|, Σw, Σbounded, n] over the valid tokens,
    max |Δ| (0 without valid tokens)), Δ = log π_old − log μ. Sum the first over ranks, max the second."""
    m = as_bool_mask(mask, trainer_log_probs)
    diff = torch.where(m, (trainer_log_probs.detach().double() - sampler_log_probs.detach().double()).abs(),
                       torch.zeros((), dtype=torch.float64, device=trainer_log_probs.device))
    sums = torch.stack([diff.sum(), torch.where(m, weights.double(), 0.0).sum(), (bounded & m).double().sum(),
                        m.double().sum()])
    return sums, diff.max() if diff.numel() else diff.new_zeros(())


def mismatch_metrics(sums: Tensor, max_diff: Tensor | float) -> dict[str, float]:
    """The `rollout/…` mismatch metrics from (all-reduced) `mismatch_sums`: mean and max |Δ| of the log-probs,
    mean applied weight, fraction of tokens truncated or masked (all 0 without valid tokens)."""
    n = float(sums[3]) or 1.0
    return {"rollout/logprob_diff_mean": float(sums[0]) / n, "rollout/logprob_diff_max": float(max_diff),
            "rollout/is_weight_mean": float(sums[1]) / n if float(sums[3]) else 1.0,
            "rollout/is_clipfrac": float(sums[2]) / n}
