"""The mathematics of VAPO and its baselines as pure torch functions (no config, no I/O, no transformers).

- :mod:`.stats` — masked sum/mean/variance/whiten, all-reducible moments, explained variance.
- :mod:`.advantages` — GAE, Decoupled-GAE, Length-Adaptive λ, GRPO advantages.
- :mod:`.losses` — loss aggregation (token-level / sample-level, global counts), Clip-Higher policy loss,
  value loss, positive-example NLL, KL penalties.
- :mod:`.logits` — token log-probs and entropies from logits.
- :mod:`.registry` — name → estimator / policy-loss tables for ablations.

All tensors are response-aligned and right-padded (B, T); masks are bool or float (non-zero = valid).
"""

from .advantages import (
    check_right_padded,
    compute_gae,
    decoupled_gae,
    grpo_advantages,
    lambda_from_lengths,
    length_adaptive_lambda,
)
from .logits import entropy_from_logits, log_probs_from_logits
from .losses import (
    KL_KINDS,
    LOSS_AGG_MODES,
    aggregate_loss,
    kl_penalty,
    policy_loss_clip_higher,
    policy_loss_ppo_clip,
    positive_nll_loss,
    value_loss,
)
from .registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    UnknownAlgorithmError,
    decoupled_gae_estimator,
    gae_estimator,
    get_advantage_estimator,
    get_policy_loss,
    grpo_estimator,
)
from .stats import (
    as_bool_mask,
    ev_from_stats,
    ev_stats,
    explained_variance,
    masked_count,
    masked_max,
    masked_mean,
    masked_moments,
    masked_sum,
    masked_var,
    masked_whiten,
    moments_to_mean_var,
    within_ev_from_stats,
    within_group_ev_stats,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "UnknownAlgorithmError",
    "aggregate_loss",
    "as_bool_mask",
    "check_right_padded",
    "compute_gae",
    "decoupled_gae",
    "decoupled_gae_estimator",
    "entropy_from_logits",
    "ev_from_stats",
    "ev_stats",
    "explained_variance",
    "gae_estimator",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo_advantages",
    "grpo_estimator",
    "kl_penalty",
    "lambda_from_lengths",
    "length_adaptive_lambda",
    "log_probs_from_logits",
    "masked_count",
    "masked_max",
    "masked_mean",
    "masked_moments",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "moments_to_mean_var",
    "policy_loss_clip_higher",
    "policy_loss_ppo_clip",
    "positive_nll_loss",
    "value_loss",
    "within_ev_from_stats",
    "within_group_ev_stats",
]
