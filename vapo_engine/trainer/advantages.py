"""Advantages and critic targets of a rollout, chosen by the registry (no `if` per ablation inside the loop).

What to compute is the config's derived decisions (`TrainConfig.decisions`): the estimator (decoupled_gae:
λ_critic for targets, λ_policy for the actor; gae: one λ for both; grpo: group-normalised outcome, no critic),
λ_policy (length-adaptive or lambda_base) and whitening (valid tokens only; never touches returns).

Every step of GAE, every whitening moment and the length of the length-adaptive λ count the tokens the policy
wrote (`Rollout.loss_mask`): a multi-turn episode's inserted tokens (tool results) are skipped, i.e. they are
part of the environment's transition from the policy token before them to the one after (docs/design.md §3.2).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from vapo_engine.algo import (
    check_right_padded,
    get_advantage_estimator,
    length_adaptive_lambda,
    masked_moments,
    masked_whiten,
    moments_to_mean_var,
)
from vapo_engine.config import TrainConfig
from vapo_engine.rollout.experience import Rollout


def policy_lambda(cfg: TrainConfig, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """λ_policy per sequence (B,) and which sequences were clamped to 0; `mask` is the loss mask (B, T), whose
    count per row is the length l of the length-adaptive λ (the tokens the policy wrote; holes allowed)."""
    if cfg.decisions.lambda_policy == "length_adaptive":
        return length_adaptive_lambda(mask, cfg.vapo.alpha, check_padding=False)
    n = mask.shape[0]
    return torch.full((n,), cfg.vapo.lambda_base, device=mask.device), torch.zeros(n, dtype=torch.bool,
                                                                                  device=mask.device)


def add_advantages(ro: Rollout, cfg: TrainConfig, *, reduce_sum=lambda t: t) -> tuple[Rollout, dict]:
    """Rollout with `advantages` (whitened if configured, with global statistics: `reduce_sum` all-reduces
    the moments across ranks) and `returns`; plus the vapo/… metrics."""
    check_right_padded(ro.response_mask)  # the extent; the loss mask may have holes (inserted tokens)
    mask = ro.loss_mask
    lam, clamped = policy_lambda(cfg, mask)
    name = cfg.decisions.estimator
    adv, ret = get_advantage_estimator(name)(
        token_rewards=ro.token_rewards, values=ro.values, mask=mask, scores=ro.scores,
        group_size=cfg.vapo.group_size, lam_policy=lam, lam_critic=cfg.vapo.lambda_critic, gamma=1.0)
    mean, var = moments_to_mean_var(reduce_sum(masked_moments(adv, mask)))
    metrics = {"vapo/lambda_policy_mean": float(lam.float().mean()), "vapo/lambda_policy_min": float(lam.min()),
               "vapo/lambda_clamped_frac": float(clamped.float().mean()),
               "vapo/advantage_mean": float(mean), "vapo/advantage_std": float(var.clamp(min=0).sqrt())}
    if cfg.decisions.whiten_advantages:
        adv = masked_whiten(adv, mask, mean=mean.to(adv.dtype), var=var.to(adv.dtype)) * mask
    return replace(ro, advantages=adv.detach(), returns=None if ret is None else ret.detach()), metrics


def monte_carlo_returns(ro: Rollout) -> Rollout:
    """Critic targets with λ = 1, γ = 1 (value pretraining): the sequence reward at every valid token."""
    _, ret = get_advantage_estimator("gae")(
        token_rewards=ro.token_rewards, values=ro.values, mask=ro.loss_mask, scores=ro.scores,
        group_size=1, lam_policy=1.0, lam_critic=1.0, gamma=1.0)
    return replace(ro, returns=ret.detach(), advantages=torch.zeros_like(ro.response_mask))
