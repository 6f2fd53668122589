"""Masked statistics over right-padded (B, T) response tensors.

Every reduction here reads **only** the valid positions of the mask: pad positions are selected away with
``torch.where`` (not multiplied by zero), so a pad holding ``nan`` or ``inf`` cannot leak into any result or
gradient. Masks may be bool or float; any non-zero entry counts as valid (the mask is binarised, never used
as a weight).

Global statistics under gradient accumulation or data parallel: compute the sufficient statistics locally
(:func:`masked_moments`, :func:`ev_stats`), all-reduce them with ``SUM``, then finish with
:func:`moments_to_mean_var` / :func:`ev_from_stats`. Sufficient statistics are float64 so that summing many
shards does not lose precision.

What this module deliberately does not do: no I/O, no config objects, no distributed calls.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

_WHITEN_EPS = 1e-8


def as_bool_mask(mask: Tensor, like: Tensor | None = None) -> Tensor:
    """Binarise a float/int/bool mask (non-zero = valid), optionally broadcast to ``like``'s shape.

    Shapes: mask (...) -> bool (...) or ``like.shape``.
    Implements: the 0/1 response mask ``m_t`` used by every masked reduction (VAPO token-level loss).
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    if like is not None and m.shape != like.shape:
        m = torch.broadcast_to(m, like.shape)
    return m


def _count_dtype(x: Tensor) -> torch.dtype:
    # Counts stay exact: never count tokens in bf16/fp16 (bf16 cannot represent 257).
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _where_valid(x: Tensor, m: Tensor) -> Tensor:
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Sum of ``x`` over valid positions.

    Shapes: x (B, T), mask (B, T) bool/float (broadcastable to x) -> scalar if ``dim`` is None, else x
    reduced over ``dim`` (e.g. (B,) for ``dim=-1``).
    Implements: Σ_t m_t·x_t (pads selected away, so nan/inf pads contribute nothing).
    """
    m = as_bool_mask(mask, x)
    valid = _where_valid(x, m)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | tuple[int, ...] | None = None, dtype=torch.float32) -> Tensor:
    """Number of valid positions.

    Shapes: mask (B, T) -> scalar if ``dim`` is None, else reduced over ``dim``; returned as ``dtype``.
    Implements: Σ_i |o_i| (the token count of the VAPO token-level loss denominator).
    """
    m = as_bool_mask(mask)
    return (m.sum() if dim is None else m.sum(dim=dim)).to(dtype)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``x`` over valid positions; 0 where there is no valid position.

    Shapes: x (B, T), mask (B, T) -> scalar if ``dim`` is None, else reduced over ``dim``.
    Implements: Σ m·x / Σ m (the token mean of verl ``masked_mean``), with an empty mask giving 0, not nan.
    """
    m = as_bool_mask(mask, x)
    count = masked_count(m, dim, dtype=_count_dtype(x))
    return masked_sum(x, m, dim) / count.clamp_min(1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all valid positions (one scalar for the whole batch).

    Shapes: x (B, T), mask (B, T) -> scalar.
    Implements: Σ m·(x − x̄)² / (n − 1) (Bessel-corrected when ``unbiased``) else / n. With n ≤ 1 the
    result is 0 (no spread can be measured), never nan.
    """
    m = as_bool_mask(mask, x)
    mean = masked_mean(x, m)
    sq = masked_sum((x - mean) ** 2, m)
    n = masked_count(m, dtype=_count_dtype(sq))
    denom = (n - 1) if unbiased else n
    return sq / denom.clamp_min(1)


def masked_moments(x: Tensor, mask: Tensor) -> Tensor:
    """Sufficient statistics (count, sum, sum of squares) of the valid entries, in float64, detached.

    Shapes: x (B, T), mask (B, T) -> Tensor[3] float64. All-reduce with SUM across ranks / micro-batches,
    then call :func:`moments_to_mean_var`.
    Implements: (n, Σx, Σx²) for the global advantage whitening of PPO/VAPO under data parallel.
    """
    m = as_bool_mask(mask, x)
    xd = x.detach().to(torch.float64)
    n = masked_count(m, dtype=torch.float64)
    return torch.stack([n, masked_sum(xd, m), masked_sum(xd * xd, m)])


def moments_to_mean_var(moments: Tensor, unbiased: bool = True) -> tuple[Tensor, Tensor]:
    """Mean and variance from (count, sum, sum of squares).

    Shapes: moments Tensor[3] -> (mean scalar, var scalar), float64. n = 0 gives (0, 0); n = 1 gives var 0
    when ``unbiased``.
    Implements: x̄ = S/n, Var = (Q − S·x̄)/(n − 1) (or /n), clamped at 0 against round-off.
    """
    moments = moments.to(torch.float64)
    n, s, q = moments[0], moments[1], moments[2]
    mean = s / n.clamp_min(1)
    denom = (n - 1) if unbiased else n
    var = ((q - s * mean) / denom.clamp_min(1)).clamp_min(0)
    return mean, var


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    mean: Tensor | float | None = None,
    var: Tensor | float | None = None,
) -> Tensor:
    """Normalise ``x`` to zero mean / unit variance using statistics of the valid positions only.

    Shapes: x (B, T), mask (B, T) -> (B, T), same dtype as x. **Pad positions are set to 0.**
    ``mean``/``var`` given (both, e.g. from all-reduced :func:`masked_moments`) → used as-is (global
    whitening under data parallel); otherwise the local unbiased masked mean/variance is used.
    ``shift_mean=False`` adds the mean back (scale-only whitening, verl semantics).
    Implements: Â ← (Â − mean)/sqrt(Var + 1e-8), the PPO advantage normalisation.
    """
    if (mean is None) != (var is None):
        raise ValueError("masked_whiten: pass both `mean` and `var` (global statistics) or neither")
    m = as_bool_mask(mask, x)
    if mean is None:
        mean, var = masked_mean(x, m), masked_var(x, m, unbiased=True)
    mean_t = torch.as_tensor(mean, device=x.device).to(x.dtype)
    var_t = torch.as_tensor(var, device=x.device).to(x.dtype)
    out = (x - mean_t) * torch.rsqrt(var_t + _WHITEN_EPS)
    if not shift_mean:
        out = out + mean_t
    return _where_valid(out, m)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest valid entry (0 when the mask is empty).

    Shapes: x (B, T), mask (B, T) -> scalar.
    Implements: max_{t: m_t = 1} x_t (used for the ``ratio_max`` diagnostic).
    """
    m = as_bool_mask(mask, x)
    if not bool(m.any()):
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(m, x, torch.full((), float("-inf"), dtype=x.dtype, device=x.device)).max()


def ev_stats(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Sufficient statistics for explained variance, float64, detached, safe to all-reduce with SUM.

    Shapes: pred (B, T), target (B, T), mask (B, T) -> Tensor[5] = (n, Σy, Σy², Σd, Σd²) with
    y = target and d = target − pred over valid positions.
    Implements: the sums behind EV = 1 − Var(y − ŷ)/Var(y) (computed globally, never averaged per
    micro-batch).
    """
    m = as_bool_mask(mask, target)
    y = target.detach().to(torch.float64)
    d = y - pred.detach().to(torch.float64)
    n = masked_count(m, dtype=torch.float64)
    return torch.stack([n, masked_sum(y, m), masked_sum(y * y, m), masked_sum(d, m), masked_sum(d * d, m)])


def ev_from_stats(stats: Tensor) -> Tensor:
    """Explained variance from (all-reduced) :func:`ev_stats`.

    Shapes: stats Tensor[5] -> scalar float64 tensor. Returns nan when undefined (no valid token, or the
    targets are constant: a standard deviation below 1e-4 absolute or 1e-6 relative — an all-zero-reward
    batch whose λ = 1 returns keep float32 residue is constant), so such a batch is never reported as a
    perfect or an absurd fit.
    Implements: EV = 1 − Var(y − ŷ)/Var(y) (CleanRL/verl ``explained_variance``, population variances).
    """
    stats = stats.to(torch.float64)
    n, sy, syy, sd, sdd = (stats[i] for i in range(5))
    nn = n.clamp_min(1)
    var_y = syy / nn - (sy / nn) ** 2
    var_d = (sdd / nn - (sd / nn) ** 2).clamp_min(0)
    # Constant targets (up to float32 residue, or float64 round-off of E[y²] − E[y]²) → undefined.
    undefined = (n < 1) | (var_y <= 1e-12 * (syy / nn).clamp_min(1e-300)) | (var_y < 1e-8)
    ev = 1.0 - var_d / torch.where(undefined, torch.ones_like(var_y), var_y)
    return torch.where(undefined, torch.full_like(ev, float("nan")), ev)


def within_group_ev_stats(pred: Tensor, target: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Sufficient statistics for explained variance *within* groups of consecutive rows (the samples of one
    prompt), float64, detached, safe to all-reduce with SUM (a group never spans ranks).

    Shapes: pred (B, T), target (B, T), mask (B, T), B divisible by group_size -> Tensor[3] = (n, SSy, SSd): the
    sums of squares of y and of d = y − ŷ around their own group's mean, over the group's valid positions.
    Implements: EV_within = 1 − SSd / SSy: the share of the variance a per-prompt baseline (GRPO's group mean)
    leaves that the predictions explain. A group's valid positions are pooled over its rows and tokens.
    """
    m = as_bool_mask(mask, target)
    b, t = target.shape
    if group_size < 1 or b % group_size:
        raise ValueError(f"{b} rows do not split into groups of {group_size}")
    y = torch.where(m, target.detach().to(torch.float64), 0.0).view(-1, group_size * t)
    d = torch.where(m, y.view(b, t) - pred.detach().to(torch.float64), 0.0).view(-1, group_size * t)
    n = m.view(-1, group_size * t).sum(1).to(torch.float64)

    def ss(x: Tensor) -> Tensor:  # Σ x² − (Σ x)² / n per group, summed over groups
        return ((x * x).sum(1) - x.sum(1) ** 2 / n.clamp_min(1)).sum()
    return torch.stack([n.sum(), ss(y), ss(d)])


def within_ev_from_stats(stats: Tensor) -> Tensor:
    """Within-group explained variance from (all-reduced) :func:`within_group_ev_stats`; nan when the targets
    do not vary inside any group (every group all right or all wrong).

    Shapes: stats Tensor[3] -> scalar float64 tensor.
    Implements: EV_within = 1 − SSd / SSy over the groups pooled (docs/design.md §3.9's EV with each group's mean as the
    baseline of the variance), the metric critic/explained_var_within_prompt.
    """
    stats = stats.to(torch.float64)
    n, ssy, ssd = stats[0], stats[1], stats[2]
    undefined = (n < 1) | (ssy / n.clamp_min(1) < 1e-8)
    ev = 1.0 - ssd.clamp_min(0) / torch.where(undefined, torch.ones_like(ssy), ssy)
    return torch.where(undefined, torch.full_like(ev, float("nan")), ev)


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Explained variance of value predictions over the valid positions of one (local) batch.

    Shapes: pred (B, T), target (B, T), mask (B, T) -> scalar float64 tensor (nan when undefined).
    For several micro-batches or ranks, sum :func:`ev_stats` and call :func:`ev_from_stats` instead of
    averaging this value.
    Implements: EV = 1 − Var(target − pred)/Var(target) (VAPO Value-Pretraining diagnostic).
    """
    return ev_from_stats(ev_stats(pred, target, mask))
