"""Token log-probabilities and entropies from language-model logits, without a full (B, T, V) log-softmax.

For float32/float64 logits, ``log p = logit[label] − logsumexp(logits)``: the only (B, T, V) temporary is the
one inside ``logsumexp`` and autograd keeps nothing new of that size. For low-precision logits (bf16/fp16)
each row is upcast to float32 on its own, so the extra memory is one (T, V) float32 slab, and the results are
float32 (bf16 log-probs are too coarse for importance ratios).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

_FULL_PRECISION = (torch.float32, torch.float64)


def _gather_log_prob(logits: Tensor, labels: Tensor) -> Tensor:
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def log_probs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-probability of each label under the categorical distribution of its logits.

    Shapes: logits (B, T, V), labels (B, T) int64 -> (B, T), float32 (float64 for float64 logits),
    differentiable w.r.t. logits. ``logits[:, t]`` must already be the prediction *for* ``labels[:, t]``
    (shift before calling). Negative labels (e.g. −100 padding) are read as token 0; mask those positions.
    Implements: log π_θ(a_t | s_t) = z_{a_t} − log Σ_v exp z_v (the token log-prob of the PPO ratio).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits (..., V) and labels must agree: {tuple(logits.shape)} vs {tuple(labels.shape)}")
    labels = labels.long().clamp_min(0)
    if logits.dtype in _FULL_PRECISION:
        return _gather_log_prob(logits, labels)
    rows = [_gather_log_prob(row.float(), lab) for row, lab in zip(logits, labels)]
    return torch.stack(rows) if rows else logits.new_zeros(labels.shape, dtype=torch.float32)


def _entropy(logits: Tensor) -> Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at every position.

    Shapes: logits (B, T, V) -> (B, T), float32 (float64 for float64 logits), differentiable.
    Computed row by row (one (T, V) float32 slab at a time) for low-precision logits.
    Implements: H(π_θ(·|s_t)) = logsumexp(z) − Σ_v softmax(z)_v · z_v (entropy-collapse diagnostic).
    """
    if logits.dtype in _FULL_PRECISION:
        return _entropy(logits)
    rows = [_entropy(row.float()) for row in logits]
    return torch.stack(rows) if rows else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
