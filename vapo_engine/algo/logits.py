"""Token log-probabilities and entropies from language-model logits, without a full (B, T, V) log-softmax.

For float32/float64 logits, ``log p = logit[label] − logsumexp(logits)``: the only (B, T, V) temporaries are
the one inside ``logsumexp`` and, at a temperature ≠ 1, the scaled logits. For low-precision logits (bf16/fp16)
each row is upcast to float32 and scaled by its temperature on its own, so the transient extra memory is one
(T, V) float32 slab rather than full float32 copies of the batch, and the results are float32 (bf16 log-probs
are too coarse for importance ratios). Under autograd, the backward of ``logsumexp`` keeps each row's float32
input, i.e. one float32 copy of the logits in all (as a float32 model's logits would be).

Temperature: ``temperature`` is a positive float (every row) or a (B,) tensor (one per row); the distribution
is softmax(logits / T). Pass the raw model logits and the temperature here rather than dividing beforehand:
``logits.float() / T`` on bf16 logits makes two full float32 copies of the batch before any of this runs.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

_FULL_PRECISION = (torch.float32, torch.float64)


def _gather_log_prob(logits: Tensor, labels: Tensor) -> Tensor:
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _entropy(logits: Tensor) -> Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def _per_row(temperature: float | Tensor, logits: Tensor, fn: str) -> list[float | Tensor]:
    """The temperature of each of the B rows of `logits` (checked: positive, a float or a (B,) tensor)."""
    b = logits.shape[0] if logits.dim() > 1 else 1
    if isinstance(temperature, Tensor):
        if temperature.dim() != 1 or temperature.shape[0] != b:
            raise ValueError(f"{fn}: temperature must be a float or a ({b},) tensor (one per row of logits "
                             f"{tuple(logits.shape)}), got shape {tuple(temperature.shape)}")
        if not bool((temperature > 0).all()):
            raise ValueError(f"{fn}: every temperature must be > 0 (use 1.0 for greedy), got "
                             f"{temperature.tolist()}")
        return list(temperature.detach().to(logits.device))
    if not temperature > 0:
        raise ValueError(f"{fn}: temperature must be > 0 (use 1.0 for greedy), got {temperature}")
    return [temperature] * b


def _scaled(x: Tensor, t: float | Tensor) -> Tensor:
    """`x` / t, without a copy when t is exactly 1."""
    if isinstance(t, Tensor):
        return x / t.to(x.dtype)
    return x if t == 1.0 else x / t


def _rows_at(logits: Tensor, temperature: float | Tensor, fn: str, op) -> Tensor:
    """op(logits_b / T_b) for every row b: at once for full precision, row by row (upcast each) otherwise."""
    temps = _per_row(temperature, logits, fn)
    if logits.dtype in _FULL_PRECISION:
        if isinstance(temperature, Tensor):
            scale = temperature.to(device=logits.device, dtype=logits.dtype).view(-1, *[1] * (logits.dim() - 1))
            return op(logits / scale, None)
        return op(_scaled(logits, temperature), None)
    return torch.stack([op(_scaled(row.float(), t), i) for i, (row, t) in enumerate(zip(logits, temps))])


def log_probs_from_logits(logits: Tensor, labels: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """Log-probability of each label under the categorical distribution softmax(logits / temperature).

    Shapes: logits (B, T, V), labels (B, T) int64, temperature a float or (B,) -> (B, T), float32 (float64 for
    float64 logits), differentiable w.r.t. logits. ``logits[:, t]`` must already be the prediction *for*
    ``labels[:, t]`` (shift before calling). Negative labels (e.g. −100 padding) are read as token 0; mask
    those positions. Implements: log π_θ(a_t | s_t) = z_{a_t}/T − log Σ_v exp(z_v/T) (the token log-prob of
    the PPO ratio, at the sampling temperature T).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits (..., V) and labels must agree: {tuple(logits.shape)} vs {tuple(labels.shape)}")
    labels = labels.long().clamp_min(0)
    if logits.numel() == 0 and logits.dtype not in _FULL_PRECISION:
        return logits.new_zeros(labels.shape, dtype=torch.float32)
    return _rows_at(logits, temperature, "log_probs_from_logits",
                    lambda z, i: _gather_log_prob(z, labels if i is None else labels[i]))


def entropy_from_logits(logits: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """Entropy of the categorical distribution softmax(logits / temperature) at every position.

    Shapes: logits (B, T, V), temperature a float or (B,) -> (B, T), float32 (float64 for float64 logits),
    differentiable. Computed row by row (one (T, V) float32 slab at a time) for low-precision logits.
    Implements: H(π_θ(·|s_t)) = logsumexp(z/T) − Σ_v softmax(z/T)_v · z_v/T (entropy-collapse diagnostic).
    """
    if logits.numel() == 0 and logits.dtype not in _FULL_PRECISION:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    return _rows_at(logits, temperature, "entropy_from_logits", lambda z, i: _entropy(z))
