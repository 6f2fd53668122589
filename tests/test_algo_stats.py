"""Masked statistics, whitening, all-reducible moments and explained variance."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vapo_engine.algo import (
    ev_from_stats,
    ev_stats,
    explained_variance,
    masked_mean,
    masked_moments,
    masked_sum,
    masked_var,
    masked_whiten,
    moments_to_mean_var,
)


def data(seed, batch=8, length=10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    x = torch.randn(batch, length, generator=g, dtype=torch.float64) * 2 + 1
    return x, mask


def with_junk_pads(x, mask, junk=float("nan")):
    return torch.where(mask.bool(), x, torch.full_like(x, junk))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_reductions_match_numpy_on_valid_entries(seed):
    x, mask = data(seed)
    valid = x[mask.bool()].numpy()
    assert masked_sum(x, mask).item() == pytest.approx(valid.sum())
    assert masked_mean(x, mask).item() == pytest.approx(valid.mean())
    assert masked_var(x, mask).item() == pytest.approx(valid.var(ddof=1))
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(valid.var())
    rows = masked_mean(x, mask, dim=-1)
    for b in range(x.shape[0]):
        assert rows[b].item() == pytest.approx(x[b][mask[b].bool()].mean().item())


def test_reductions_ignore_nan_pads_and_accept_bool_masks():
    x, mask = data(3)
    junk = with_junk_pads(x, mask)
    for fn in (masked_sum, masked_mean, masked_var):
        assert torch.equal(fn(x, mask), fn(junk, mask.bool()))
    assert torch.equal(masked_mean(x, mask, dim=-1), masked_mean(junk, mask, dim=-1))


def test_empty_mask_gives_zero_not_nan():
    x = torch.randn(2, 3)
    empty = torch.zeros(2, 3)
    assert masked_mean(x, empty).item() == 0.0 and masked_var(x, empty).item() == 0.0
    assert masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0


def test_whiten_uses_only_valid_positions_and_zeroes_pads():
    x, mask = data(4)
    w = masked_whiten(x, mask)
    valid = w[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(w[~mask.bool()], torch.zeros(int((mask == 0).sum()), dtype=x.dtype))
    assert torch.equal(w, masked_whiten(with_junk_pads(x, mask, 1e6), mask))
    scaled = masked_whiten(x, mask, shift_mean=False)
    assert scaled[mask.bool()].mean().item() == pytest.approx(masked_mean(x, mask).item())


def test_moments_summed_over_shards_give_global_whitening():
    x, mask = data(5)
    shards = [masked_moments(x[r], mask[r]) for r in torch.arange(8).split(3)]
    mean, var = moments_to_mean_var(sum(shards))
    valid = x[mask.bool()].numpy()
    assert mean.item() == pytest.approx(valid.mean()) and var.item() == pytest.approx(valid.var(ddof=1))
    assert moments_to_mean_var(sum(shards), unbiased=False)[1].item() == pytest.approx(valid.var())
    global_w = masked_whiten(x[:3], mask[:3], mean=mean, var=var)
    assert torch.allclose(global_w, masked_whiten(x, mask)[:3], atol=1e-12)
    local_w = masked_whiten(x[:3], mask[:3])
    assert not torch.allclose(global_w, local_w)
    with pytest.raises(ValueError):
        masked_whiten(x, mask, mean=mean)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_explained_variance_matches_numpy_on_concatenated_data(seed):
    target, mask = data(seed)
    g = torch.Generator().manual_seed(100 + seed)
    pred = target * 0.7 + torch.randn(target.shape, generator=g, dtype=torch.float64) * 0.8
    y, p = target[mask.bool()].numpy(), pred[mask.bool()].numpy()
    expected = 1 - np.var(y - p) / np.var(y)
    assert explained_variance(pred, target, mask).item() == pytest.approx(expected, abs=1e-10)
    micro = [torch.arange(0, 2), torch.arange(2, 3), torch.arange(3, 8)]
    total = sum(ev_stats(pred[r], target[r], mask[r]) for r in micro)
    assert ev_from_stats(total).item() == pytest.approx(expected, abs=1e-10)
    averaged = np.mean([explained_variance(pred[r], target[r], mask[r]).item() for r in micro])
    assert averaged != pytest.approx(expected, abs=1e-3)  # the pitfall: EV averaged over micro-batches
    junk = with_junk_pads(pred, mask, float("inf"))
    assert torch.equal(explained_variance(junk, target, mask), explained_variance(pred, target, mask))


def test_explained_variance_perfect_and_undefined_cases():
    target, mask = data(9)
    assert explained_variance(target, target, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(target) + masked_mean(target, mask), target, mask).item() == \
        pytest.approx(0.0, abs=1e-12)
    const = torch.full_like(target, 0.3)
    assert math.isnan(explained_variance(target, const, mask).item())
    assert math.isnan(explained_variance(target, target, torch.zeros_like(mask)).item())


def test_ev_of_an_all_zero_reward_batch_is_undefined_not_huge():
    """λ = 1 returns of an all-zero-reward batch keep float32 residue (~1e-8); the EV must be nan, not −1e13."""
    import math

    from vapo_engine.algo import ev_from_stats, ev_stats
    g = torch.Generator().manual_seed(0)
    targets = (torch.randn(8, 30, generator=g) * 3e-8).float()  # residue around 0
    values = torch.randn(8, 30, generator=g) * 0.3
    mask = torch.ones(8, 30)
    assert math.isnan(float(ev_from_stats(ev_stats(values, targets, mask))))
    real = torch.zeros(8, 30)
    real[:4] = 1.0  # half the sequences succeed: a well-defined EV
    assert math.isfinite(float(ev_from_stats(ev_stats(values, real, mask))))


@pytest.mark.parametrize("seed", [0, 1])
def test_within_group_ev_matches_numpy_and_sums_over_shards(seed):
    """EV within prompt groups: each group's mean removed from targets and residuals (pooled over its rows'
    valid tokens), the same from sums over any split of whole groups, pads (even inf) never read."""
    from vapo_engine.algo import within_ev_from_stats, within_group_ev_stats
    target, mask = data(seed)  # 8 rows
    g = torch.Generator().manual_seed(200 + seed)
    pred = target * 0.5 + torch.randn(target.shape, generator=g, dtype=torch.float64) * 0.5
    num = den = 0.0
    for rows in (range(4), range(4, 8)):  # two groups of 4
        m = mask[list(rows)].bool().numpy()
        y = target[list(rows)].numpy()[m]
        d = y - pred[list(rows)].numpy()[m]
        num += ((d - d.mean()) ** 2).sum()
        den += ((y - y.mean()) ** 2).sum()
    expected = 1 - num / den
    stats = within_group_ev_stats(pred, target, mask, 4)
    assert within_ev_from_stats(stats).item() == pytest.approx(expected, abs=1e-10)
    shards = within_group_ev_stats(pred[:4], target[:4], mask[:4], 4) + within_group_ev_stats(
        pred[4:], target[4:], mask[4:], 4)
    assert within_ev_from_stats(shards).item() == pytest.approx(expected, abs=1e-10)
    junk = with_junk_pads(pred, mask, float("inf"))
    assert torch.equal(within_group_ev_stats(junk, target, mask, 4), stats)
    # a per-group constant prediction (the group's mean: GRPO's baseline) explains nothing within groups
    means = torch.cat([torch.full((4, target.shape[1]), float(target[:4][mask[:4].bool()].mean())),
                       torch.full((4, target.shape[1]), float(target[4:][mask[4:].bool()].mean()))]).double()
    assert within_ev_from_stats(within_group_ev_stats(means, target, mask, 4)).item() == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        within_group_ev_stats(pred, target, mask, 3)
    assert math.isnan(within_ev_from_stats(within_group_ev_stats(pred, torch.ones_like(target), mask, 4)).item())
