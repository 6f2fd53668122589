"""Truncated / masked importance sampling of the sampler–trainer mismatch (vapo_engine/algo/mismatch.py), against
hand-computed vectors; and the identity the trainer relies on: weighting the advantages weights the PG loss."""
from __future__ import annotations

import math

import pytest
import torch

from vapo_engine.algo import policy_loss_clip_higher
from vapo_engine.algo.mismatch import (
    importance_weights,
    mismatch_metrics,
    mismatch_sums,
    weighted_advantages,
)

# Δ = trainer − sampler = [0, 1, −0.3, pad]; ratio = [1, e, e^−0.3 = 0.740818, pad]
TRAINER = torch.tensor([[-1.0, -2.0, -0.5, float("nan")]])
SAMPLER = torch.tensor([[-1.0, -3.0, -0.2, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
E03 = math.exp(-0.3)


@pytest.mark.parametrize("mode, cap, weights, bounded", [
    ("truncate", 2.0, [1.0, 2.0, E03, 0.0], [False, True, False, False]),
    ("truncate", 1.25, [1.0, 1.25, E03, 0.0], [False, True, False, False]),  # only the upper side is bounded
    ("mask", 2.0, [1.0, 0.0, E03, 0.0], [False, True, False, False]),  # kept in [0.5, 2]: e is out
    ("mask", 1.25, [1.0, 0.0, 0.0, 0.0], [False, True, True, False]),  # [0.8, 1.25]: e^−0.3 is out too
    ("off", 2.0, [1.0, 1.0, 1.0, 0.0], [False, False, False, False]),
])
def test_weights_by_hand(mode, cap, weights, bounded):
    w, b = importance_weights(TRAINER, SAMPLER, MASK, cap=cap, mode=mode)
    assert torch.allclose(w, torch.tensor([weights]), atol=1e-6)
    assert b.tolist() == [bounded]
    assert not w.requires_grad and torch.isfinite(w).all()  # the nan pad leaks nowhere


def test_metrics_by_hand():
    w, b = importance_weights(TRAINER, SAMPLER, MASK, cap=2.0, mode="truncate")
    sums, mx = mismatch_sums(TRAINER, SAMPLER, w, b, MASK)
    m = mismatch_metrics(sums, mx)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(1.3 / 3)
    assert m["rollout/logprob_diff_max"] == pytest.approx(1.0)
    assert m["rollout/is_weight_mean"] == pytest.approx((1 + 2 + E03) / 3)
    assert m["rollout/is_clipfrac"] == pytest.approx(1 / 3)
    # Statistics of two shards summed (as ranks all-reduce them) equal those of the whole batch.
    halves = [mismatch_sums(TRAINER[:, s], SAMPLER[:, s], w[:, s], b[:, s], MASK[:, s])[0]
              for s in (slice(0, 2), slice(2, 4))]
    assert torch.allclose(halves[0] + halves[1], sums)
    empty = mismatch_metrics(torch.zeros(4, dtype=torch.float64), 0.0)
    assert empty == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0,
                     "rollout/is_weight_mean": 1.0, "rollout/is_clipfrac": 0.0}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="valid modes: truncate, mask, off"):
        importance_weights(TRAINER, SAMPLER, MASK, mode="clip")
    with pytest.raises(ValueError, match="cap must be > 1"):
        importance_weights(TRAINER, SAMPLER, MASK, cap=1.0)
    with pytest.raises(ValueError, match="differ in shape"):
        importance_weights(TRAINER, SAMPLER[:, :3], MASK)


def test_huge_log_ratio_stays_finite():
    w, b = importance_weights(torch.tensor([[0.0, -500.0]]), torch.tensor([[-500.0, 0.0]]), torch.ones(1, 2))
    assert w.tolist() == [[2.0, pytest.approx(math.exp(-20))]] and b.tolist() == [[True, False]]


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_weighting_the_advantages_weights_each_tokens_pg_loss(dual_clip):
    """The clipped surrogate is positively homogeneous in A, so L(ρ, w·A) = w·L(ρ, A) token by token: the
    trainer's way of applying the weights is exactly the weighted loss (values and gradients)."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 3
    new = (old + torch.randn(3, 5, generator=g) * 0.4).requires_grad_(True)
    adv = torch.randn(3, 5, generator=g) * 2
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    w = torch.rand(3, 5, generator=g) * 2.5
    w[0, 1] = 0.0  # a masked token
    n = float(mask.sum())
    loss = policy_loss_clip_higher(new, old, weighted_advantages(adv, w), mask, dual_clip=dual_clip,
                                   global_token_count=n)[0]
    grad = torch.autograd.grad(loss, new)[0]
    ref, ref_grad = torch.zeros(()), torch.zeros_like(new)
    for i, t in mask.nonzero().tolist():
        one = torch.zeros_like(mask)
        one[i, t] = 1.0
        lt = policy_loss_clip_higher(new, old, adv, one, dual_clip=dual_clip, global_token_count=n)[0]
        ref = ref + w[i, t] * lt.detach()
        ref_grad += w[i, t] * torch.autograd.grad(lt, new)[0]
    assert torch.allclose(loss.detach(), ref, atol=1e-6) and torch.allclose(grad, ref_grad, atol=1e-6)
    assert weighted_advantages(adv, None) is adv  # no weights: the very same tensor, so nothing changes
