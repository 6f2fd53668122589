"""Name → function registries so an ablation swaps functions, not ``if`` branches.

Advantage estimators share one keyword-only signature::

    fn(*, token_rewards, values, mask, scores, group_size, lam_policy, lam_critic, gamma)
        -> (advantages (B, T), returns (B, T) or None)

- ``decoupled_gae`` (VAPO): policy advantages from ``lam_policy`` (float or per-sequence (B,)), critic
  returns from a separate ``lam_critic`` pass.
- ``gae`` (vanilla PPO): one λ = ``lam_policy`` for both the policy advantages and the critic returns
  (``lam_critic`` is ignored).
- ``grpo`` (GRPO/DAPO baseline, critic-free): group-normalised ``scores`` (defaults to the summed token
  rewards); ``values``, the λs and ``gamma`` are ignored and returns are None.

Policy losses share the signature of :func:`policy_loss_clip_higher`:
``clip_higher`` (VAPO/DAPO, ε_low ≠ ε_high), ``ppo_clip`` (symmetric, ε_high forced to ε_low) and ``none``
(no policy-gradient term: rejection-sampling fine-tuning, whose loss is the positive-example NLL alone).
No estimator whitens; the caller decides (globally under data parallel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vapo_engine.registry import Registry, UnknownNameError

from .advantages import compute_gae, decoupled_gae, grpo_advantages
from .losses import policy_loss_clip_higher, policy_loss_none, policy_loss_ppo_clip
from .stats import masked_sum

Tensor = torch.Tensor


class UnknownAlgorithmError(UnknownNameError):
    """An unknown estimator/loss name; catchable as KeyError or ValueError, message lists the valid names."""


def _require_values(values: Tensor | None, name: str) -> Tensor:
    if values is None:
        raise ValueError(f"advantage estimator {name!r} needs critic `values` (B, T)")
    return values


def decoupled_gae_estimator(
    *, token_rewards: Tensor, values: Tensor | None = None, mask: Tensor, scores: Tensor | None = None,
    group_size: int | None = None, lam_policy: float | Tensor = 0.95, lam_critic: float | Tensor = 1.0,
    gamma: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor | None]:
    """Registry entry ``decoupled_gae`` (VAPO).

    Shapes: token_rewards, values, mask (B, T); lam_policy/lam_critic float or (B,) -> (advantages (B, T),
    critic returns (B, T)). ``scores``/``group_size`` are ignored.
    Implements: VAPO Decoupled-GAE (+ Length-Adaptive λ when lam_policy is per sequence).
    """
    del scores, group_size
    values = _require_values(values, "decoupled_gae")
    return decoupled_gae(token_rewards, values, mask, lam_policy=lam_policy, lam_critic=lam_critic,
                         gamma=gamma)


def gae_estimator(
    *, token_rewards: Tensor, values: Tensor | None = None, mask: Tensor, scores: Tensor | None = None,
    group_size: int | None = None, lam_policy: float | Tensor = 0.95, lam_critic: float | Tensor = 1.0,
    gamma: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor | None]:
    """Registry entry ``gae`` (vanilla PPO): one λ (= ``lam_policy``) for actor and critic.

    Shapes: token_rewards, values, mask (B, T) -> (advantages (B, T), returns (B, T)). ``lam_critic``,
    ``scores`` and ``group_size`` are ignored.
    Implements: PPO with GAE(γ, λ) (Schulman et al. 2016/2017): returns = Â^λ + V.
    """
    del scores, group_size, lam_critic
    values = _require_values(values, "gae")
    return compute_gae(token_rewards, values, mask, gamma=gamma, lam=lam_policy)


def grpo_estimator(
    *, token_rewards: Tensor, values: Tensor | None = None, mask: Tensor, scores: Tensor | None = None,
    group_size: int | None = None, lam_policy: float | Tensor = 0.95, lam_critic: float | Tensor = 1.0,
    gamma: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor | None]:
    """Registry entry ``grpo`` (critic-free GRPO/DAPO baseline).

    Shapes: scores (B,) (default: Σ_t m·token_rewards), mask (B, T) -> (advantages (B, T), None).
    Implements: Â_i = (R_i − mean_group R) / (std_group R + ε), broadcast over the tokens of response i.
    """
    del values, lam_policy, lam_critic, gamma
    if group_size is None:
        raise ValueError("advantage estimator 'grpo' needs `group_size`")
    if scores is None:
        scores = masked_sum(token_rewards, mask, dim=-1)
    return grpo_advantages(scores, mask, group_size), None


ADVANTAGE_ESTIMATORS = Registry("advantage estimator", error=UnknownAlgorithmError, entries={
    "decoupled_gae": decoupled_gae_estimator,
    "gae": gae_estimator,
    "grpo": grpo_estimator,
})

POLICY_LOSSES = Registry("policy loss", error=UnknownAlgorithmError, entries={
    "clip_higher": policy_loss_clip_higher,
    "ppo_clip": policy_loss_ppo_clip,
    "none": policy_loss_none,
})


def get_advantage_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor | None]]:
    """Look up an advantage estimator by name (``decoupled_gae``, ``gae``, ``grpo``).

    Shapes: see the module docstring (all entries share one keyword-only signature).
    Implements: the ablation switch VAPO ↔ vanilla PPO ↔ GRPO/DAPO. Unknown name → UnknownAlgorithmError
    (a KeyError and ValueError) listing the valid names.
    """
    return ADVANTAGE_ESTIMATORS.lookup(name)


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """Look up a policy loss by name (``clip_higher``, ``ppo_clip``, ``none``).

    Shapes: as :func:`vapo_engine.algo.losses.policy_loss_clip_higher`.
    Implements: the "w/o Clip-Higher" ablation switch. Unknown name → UnknownAlgorithmError listing the
    valid names.
    """
    return POLICY_LOSSES.lookup(name)
