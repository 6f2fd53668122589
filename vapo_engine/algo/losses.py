"""Loss functions of VAPO and its PPO baselines: aggregation, clipped policy loss, value loss, positive NLL, KL.

Every function takes right-padded (B, T) tensors and a bool/float response mask. Pad positions are selected
away *before* any arithmetic that could turn a pad's nan/inf into a nan gradient, so pads never change a loss
or a gradient. Metrics are detached scalar tensors computed over the local valid tokens.

Loss aggregation and the global denominators (the VAPO token-level loss): pass the token count (or sequence
count) of the whole mini-batch — summed over gradient-accumulation micro-batches and all-reduced over
data-parallel ranks — and *sum* the per-micro-batch losses (DDP averages gradients over ranks, so scale by the
world size when the count is global over ranks). This reproduces the full-batch loss exactly; dividing each
micro-batch by its own token count does not.

What this module deliberately does not do: no optimizer steps, no distributed calls, no config objects.
"""

from __future__ import annotations

import torch

from .stats import as_bool_mask, masked_count, masked_max, masked_mean, masked_sum

Tensor = torch.Tensor
Count = int | float | Tensor | None

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_KINDS = ("k1", "k2", "k3")
_LOG_RATIO_LIMIT = 20.0  # exp(±20) stays finite in fp32; larger log-ratios are numerically meaningless


def _denominator(count: Count, local: Tensor) -> Tensor:
    if count is None:
        d = local
    else:
        d = torch.as_tensor(count, device=local.device).to(local.dtype)
    return d.clamp_min(1)


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token_mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> Tensor:
    """Reduce a per-token loss matrix to a scalar.

    Shapes: loss_mat (B, T), mask (B, T) -> scalar.
    Modes:
    - ``token_mean``: Σ_i Σ_t m·L / N, N = ``global_token_count`` or the local valid-token count.
    - ``seq_mean_token_mean``: Σ_i (Σ_t m·L / |o_i|) / S, S = ``global_seq_count`` or the number of local
      rows with at least one valid token (empty rows contribute nothing).
    - ``seq_mean_token_sum``: Σ_i Σ_t m·L / S.
    An empty batch gives 0 (never nan).
    Implements: VAPO token-level loss L = −1/Σ|o_i| · Σ_i Σ_t (…) (``token_mean``) versus the
    sample-level PPO/GRPO loss −1/G Σ_i 1/|o_i| Σ_t (…) (``seq_mean_token_mean``).
    """
    m = as_bool_mask(mask, loss_mat)
    cdtype = torch.float64 if loss_mat.dtype == torch.float64 else torch.float32
    if mode == "token_mean":
        return masked_sum(loss_mat, m) / _denominator(global_token_count, masked_count(m, dtype=cdtype))
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    row_sum = masked_sum(loss_mat, m, dim=-1)
    row_count = masked_count(m, dim=-1, dtype=cdtype)
    if mode == "seq_mean_token_mean":
        row_sum = row_sum / row_count.clamp_min(1)
    n_seq = (row_count > 0).sum().to(cdtype)
    return row_sum.sum() / _denominator(global_seq_count, n_seq)


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0 <= clip_low < 1:
        raise ValueError(f"clip_low (ε_low) must be in [0, 1), got {clip_low}")
    if not clip_high >= 0:
        raise ValueError(f"clip_high (ε_high) must be >= 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip (c) must be > 1 or None, got {dual_clip}")


def policy_loss_clip_higher(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    reduction: str = "token_mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate policy loss with decoupled bounds (Clip-Higher) and optional dual-clip.

    Shapes: log_probs (B, T) [grad], old_log_probs (B, T), advantages (B, T), mask (B, T) -> (loss scalar,
    metrics dict of detached scalars). ρ = exp(log π_θ − log π_old), log-ratio clamped to ±20.
    Per token: L = max(−Aρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)); with ``dual_clip`` c > 1 and A < 0:
    L = min(L, −A·c). Reduced with :func:`aggregate_loss` (``reduction``, global counts).
    Metrics: ``pg_clipfrac`` (clipped term active), ``pg_clipfrac_high`` (A > 0, ρ > 1 + ε_high),
    ``pg_clipfrac_low`` (A < 0, ρ < 1 − ε_low), ``pg_clipfrac_dual`` (dual bound active),
    ``approx_kl`` (k3 estimate of KL(π_old‖π_θ) = E[(ρ − 1) − log ρ]), ``ratio_mean``, ``ratio_max``.
    Implements: VAPO/DAPO Clip-Higher  L = −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A); dual-clip PPO
    (Ye et al. 2020) when enabled.
    """
    _check_clip(clip_low, clip_high, dual_clip)
    m = as_bool_mask(mask, log_probs)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    adv = torch.where(m, advantages.detach().to(log_probs.dtype), zero)
    log_ratio = torch.where(m, log_probs - old_log_probs.detach().to(log_probs.dtype), zero)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clip_active = loss_clipped > loss_unclipped
    per_token = torch.where(clip_active, loss_clipped, loss_unclipped)
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        loss_dual = -adv * dual_clip
        dual_active = (adv < 0) & (loss_dual < per_token)
        per_token = torch.where(dual_active, loss_dual, per_token)
    loss = aggregate_loss(per_token, m, reduction, global_token_count, global_seq_count)
    with torch.no_grad():
        f = clip_active.to(ratio.dtype)
        metrics = {
            "pg_clipfrac": masked_mean(f, m),
            "pg_clipfrac_high": masked_mean(f * (adv > 0), m),
            "pg_clipfrac_low": masked_mean(f * (adv < 0), m),
            "pg_clipfrac_dual": masked_mean(dual_active.to(ratio.dtype), m),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": masked_max(ratio, m),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def policy_loss_none(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    reduction: str = "token_mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """No policy-gradient term: a zero loss that keeps the autograd graph, with the ratio statistics of
    :func:`policy_loss_clip_higher` (same arguments and shapes). Rejection-sampling fine-tuning (RFT) uses it:
    its only loss is the positive-example NLL on the policy's own correct samples.
    Implements: L_pg = 0 (the advantages are ignored)."""
    return policy_loss_clip_higher(log_probs, old_log_probs, torch.zeros_like(advantages), mask, clip_low, clip_high,
                                   dual_clip, reduction, global_token_count, global_seq_count)


def policy_loss_ppo_clip(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    reduction: str = "token_mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Vanilla symmetric PPO clip: :func:`policy_loss_clip_higher` with ε_high forced to ε_low.

    Shapes: as :func:`policy_loss_clip_higher` (same signature; ``clip_high`` is ignored).
    Implements: PPO L = −min(ρA, clip(ρ, 1 − ε, 1 + ε)A) (Schulman et al. 2017), the "w/o Clip-Higher"
    ablation and the vanilla-PPO baseline.
    """
    del clip_high
    return policy_loss_clip_higher(
        log_probs, old_log_probs, advantages, mask, clip_low=clip_low, clip_high=clip_low,
        dual_clip=dual_clip, reduction=reduction, global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_range: float | None = None,
    reduction: str = "token_mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic loss: half squared error to the critic targets, optionally clipped around the old values.

    Shapes: values (B, T) [grad], old_values (B, T), returns (B, T) [critic targets, e.g. λ_critic = 1
    returns], mask (B, T) -> (loss scalar, metrics). Metrics: ``vf_clipfrac`` (clipped branch chosen; 0
    without clipping), ``value_mean``, ``return_mean``.
    Implements: L_V = ½·max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²) (PPO value clipping); without
    ``clip_range``: ½·(V − R)²; reduced with :func:`aggregate_loss`.
    """
    m = as_bool_mask(mask, values)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    target = returns.detach().to(values.dtype)
    err = torch.where(m, values - target, zero) ** 2
    chosen_clip = torch.zeros_like(m)
    if clip_range is not None:
        if not clip_range > 0:
            raise ValueError(f"clip_range must be > 0 or None, got {clip_range}")
        old = old_values.detach().to(values.dtype)
        v_clipped = old + (values - old).clamp(-clip_range, clip_range)
        err_clipped = torch.where(m, v_clipped - target, zero) ** 2
        chosen_clip = err_clipped > err
        err = torch.where(chosen_clip, err_clipped, err)
    loss = aggregate_loss(0.5 * err, m, reduction, global_token_count, global_seq_count)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean(chosen_clip.to(values.dtype), m),
            "value_mean": masked_mean(values, m),
            "return_mean": masked_mean(target, m),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def positive_nll_loss(
    log_probs: Tensor, mask: Tensor, correct: Tensor, global_token_count: Count = None
) -> Tensor:
    """Positive-example LM loss: token-mean negative log-likelihood over correct responses only.

    Shapes: log_probs (B, T) [grad], mask (B, T), correct (B,) bool (non-zero = correct) -> scalar.
    Denominator: the valid tokens of correct rows (``global_token_count`` = that count summed over
    micro-batches/ranks when given). No correct row → a 0 of log_probs' dtype/device, still connected to
    the graph when log_probs requires grad (zero gradient). Incorrect rows never contribute.
    Implements: L_NLL = −1/Σ_{o_i∈T}|o_i| · Σ_{o_i∈T} Σ_t log π_θ(a_t|s_t), T = correct set
    (VAPO Positive-Example LM loss, added as μ·L_NLL).
    """
    if correct.dim() != 1 or correct.shape[0] != log_probs.shape[0]:
        raise ValueError(f"correct must be ({log_probs.shape[0]},), got {tuple(correct.shape)}")
    m = as_bool_mask(mask, log_probs) & as_bool_mask(correct).unsqueeze(-1)
    cdtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    return -masked_sum(log_probs, m) / _denominator(global_token_count, masked_count(m, dtype=cdtype))


def kl_penalty(
    log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k1", mask: Tensor | None = None
) -> Tensor:
    """Per-token KL penalty of the policy to a frozen reference model (tokens sampled from π_θ).

    Shapes: log_probs (B, T) [grad], ref_log_probs (B, T), optional mask (B, T) -> (B, T). With ``mask``
    the pads are 0 (and cannot produce nan gradients); without it, pads hold arbitrary values that the
    caller must mask. Let d = log π_θ − log π_ref:
    - ``k1``: d (unbiased, can be negative);  ``k2``: ½·d²;
    - ``k3``: exp(−d) − 1 + d (unbiased, ≥ 0, low variance; d clamped to ±20 before exp).
    Implements: Schulman's KL estimators of KL(π_θ‖π_ref) (GRPO uses k3; PPO-RLHF uses k1).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL penalty kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")
    diff = log_probs - ref_log_probs.detach().to(log_probs.dtype)
    if mask is not None:
        diff = torch.where(as_bool_mask(mask, diff), diff, torch.zeros((), dtype=diff.dtype,
                                                                        device=diff.device))
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff * diff
    d = diff.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return torch.exp(-d) - 1.0 + d
