"""Loss aggregation, Clip-Higher policy loss, value loss, positive-example NLL and KL penalties (docs/design.md §3)."""
from __future__ import annotations

import pytest
import torch

from vapo_engine.algo import (
    aggregate_loss,
    get_policy_loss,
    kl_penalty,
    policy_loss_clip_higher,
    policy_loss_ppo_clip,
    positive_nll_loss,
    value_loss,
)

METRIC_KEYS = {"pg_clipfrac_high", "pg_clipfrac_low", "pg_clipfrac", "approx_kl", "ratio_mean", "ratio_max"}


def ragged(seed, batch=8, length=9, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 1, 3, 7, 2, 9, 5, 4])[:batch]
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(dtype)
    return torch.randn(batch, length, generator=g, dtype=dtype), mask


def one_token(log_ratio, adv, **kw):
    """Policy loss of a single valid token with a given log-ratio and advantage; returns loss, grad, metrics."""
    lp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss_clip_higher(lp, torch.zeros(1, 1, dtype=torch.float64),
                                            torch.tensor([[adv]], dtype=torch.float64), torch.ones(1, 1), **kw)
    loss.backward()
    return loss.item(), lp.grad.item(), metrics


# --- aggregation ------------------------------------------------------------------------------------------

def test_aggregate_modes_match_hand_formulas():
    loss, mask = ragged(0)
    lengths = mask.sum(1)
    per_seq_sum = (loss * mask).sum(1)
    assert aggregate_loss(loss, mask).item() == pytest.approx((per_seq_sum.sum() / lengths.sum()).item())
    assert aggregate_loss(loss, mask, "seq_mean_token_mean").item() == pytest.approx(
        (per_seq_sum / lengths).mean().item())
    assert aggregate_loss(loss, mask, "seq_mean_token_sum").item() == pytest.approx(per_seq_sum.mean().item())
    assert aggregate_loss(loss, mask, "token_mean").item() != pytest.approx(
        aggregate_loss(loss, mask, "seq_mean_token_mean").item())


def test_aggregate_empty_mask_is_zero_and_unknown_mode_raises():
    loss = torch.randn(2, 3)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        assert aggregate_loss(loss, torch.zeros(2, 3), mode).item() == 0.0
    with pytest.raises(ValueError, match="token_mean"):
        aggregate_loss(loss, torch.ones(2, 3), "sum_everything")


def test_seq_modes_count_only_rows_with_valid_tokens():
    loss = torch.tensor([[1.0, 3.0], [5.0, 0.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])  # the last row is empty (e.g. a truncated prompt)
    assert aggregate_loss(loss, mask, "seq_mean_token_mean").item() == pytest.approx((2.0 + 5.0) / 2)
    assert aggregate_loss(loss, mask, "seq_mean_token_sum").item() == pytest.approx((4.0 + 5.0) / 2)
    assert aggregate_loss(loss, mask, "seq_mean_token_sum", global_seq_count=3).item() == pytest.approx(3.0)


@pytest.mark.parametrize("mode,count_kw", [("token_mean", "global_token_count"),
                                           ("seq_mean_token_mean", "global_seq_count"),
                                           ("seq_mean_token_sum", "global_seq_count")])
def test_micro_batches_with_global_count_equal_full_batch(mode, count_kw):
    base, mask = ragged(1)
    weights = torch.randn(8, 9, dtype=torch.float64, requires_grad=True)
    full = aggregate_loss(base * weights, mask, mode)
    (full_grad,) = torch.autograd.grad(full, weights)
    count = mask.sum() if mode == "token_mean" else int((mask.sum(1) > 0).sum())
    accumulated = torch.zeros((), dtype=torch.float64)
    naive = []
    for rows in torch.arange(8).split(2):  # 4 micro-batches of 2 ragged rows
        micro = aggregate_loss(base[rows] * weights[rows], mask[rows], mode, **{count_kw: count})
        accumulated = accumulated + micro
        naive.append(aggregate_loss(base[rows] * weights[rows], mask[rows], mode).item())
    (acc_grad,) = torch.autograd.grad(accumulated, weights)
    assert accumulated.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(acc_grad, full_grad, atol=1e-12)
    if mode == "token_mean":  # the pitfall: averaging per-micro-batch token means
        assert sum(naive) / 4 != pytest.approx(full.item(), abs=1e-6)


# --- Clip-Higher policy loss ------------------------------------------------------------------------------

def test_clip_higher_ratio_125_unclipped_at_028_clipped_at_020():
    log_r = torch.log(torch.tensor(1.25)).item()
    loss, grad, m = one_token(log_r, 2.0, clip_high=0.28)
    assert loss == pytest.approx(-2.0 * 1.25) and grad == pytest.approx(-2.0 * 1.25)
    assert m["pg_clipfrac_high"].item() == 0.0
    loss, grad, m = one_token(log_r, 2.0, clip_high=0.2)
    assert loss == pytest.approx(-2.0 * 1.2) and grad == 0.0
    assert m["pg_clipfrac_high"].item() == 1.0 and m["pg_clipfrac"].item() == 1.0
    assert m["pg_clipfrac_low"].item() == 0.0


@pytest.mark.parametrize("ratio,adv,zero_grad", [
    (1.5, 1.0, True),    # A > 0 above 1 + ε_high: clipped, no gradient
    (0.5, -1.0, True),   # A < 0 below 1 − ε_low: clipped, no gradient
    (1.1, 1.0, False),   # inside the band
    (0.9, -1.0, False),  # inside the band
    (0.5, 1.0, False),   # A > 0 below the band: pessimistic min keeps the unclipped term
    (1.5, -1.0, False),  # A < 0 above the band: unclipped (dual-clip off by default)
])
def test_gradients_are_zero_exactly_where_the_clip_is_active(ratio, adv, zero_grad):
    log_r = torch.log(torch.tensor(ratio, dtype=torch.float64)).item()
    loss, grad, m = one_token(log_r, adv)
    if zero_grad:
        assert grad == 0.0
        key = "pg_clipfrac_high" if adv > 0 else "pg_clipfrac_low"
        assert m[key].item() == 1.0
        bound = 1.28 if adv > 0 else 0.8
        assert loss == pytest.approx(-adv * bound)
    else:
        assert grad == pytest.approx(-adv * ratio)  # d(−Aρ)/d log π = −Aρ
        assert m["pg_clipfrac"].item() == 0.0


def test_dual_clip_off_by_default_and_bounds_negative_advantages_when_on():
    log_r = torch.log(torch.tensor(5.0, dtype=torch.float64)).item()
    loss, grad, m = one_token(log_r, -1.0)
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    loss, grad, m = one_token(log_r, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0 and m["pg_clipfrac_dual"].item() == 1.0
    loss, grad, _ = one_token(log_r, 1.0, dual_clip=3.0)  # never applies to A > 0
    assert loss == pytest.approx(-1.28) and grad == 0.0
    with pytest.raises(ValueError):
        one_token(0.0, 1.0, dual_clip=0.5)


def test_ppo_clip_is_symmetric_and_registry_returns_it():
    log_r = torch.log(torch.tensor(1.25)).item()
    lp = torch.tensor([[log_r]], requires_grad=True)
    args = (lp, torch.zeros(1, 1), torch.tensor([[2.0]]), torch.ones(1, 1))
    loss, m = policy_loss_ppo_clip(*args, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-2.4) and m["pg_clipfrac_high"].item() == 1.0
    loss_r, _ = get_policy_loss("ppo_clip")(*args, clip_low=0.2, clip_high=0.28)
    loss_ch, _ = get_policy_loss("clip_higher")(*args, clip_low=0.2, clip_high=0.28)
    assert loss_r.item() == pytest.approx(-2.4) and loss_ch.item() == pytest.approx(-2.5)


def batch_policy_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    _, mask = ragged(seed, dtype=torch.float32)
    old = -torch.rand(8, 9, generator=g) * 3
    new = old + torch.randn(8, 9, generator=g) * 0.3
    adv = torch.randn(8, 9, generator=g)
    return new, old, adv, mask


def test_policy_loss_metrics_and_pad_invariance():
    new, old, adv, mask = batch_policy_inputs(2)
    lp = new.clone().requires_grad_(True)
    loss, metrics = policy_loss_clip_higher(lp, old, adv, mask)
    loss.backward()
    assert METRIC_KEYS <= set(metrics)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    assert metrics["approx_kl"].item() > 0
    pad = mask == 0
    junk = torch.full_like(new, float("nan"))
    lp2 = torch.where(pad, junk, new).requires_grad_(True)
    loss2, metrics2 = policy_loss_clip_higher(lp2, torch.where(pad, -junk, old), torch.where(pad, junk, adv),
                                              mask.bool())
    loss2.backward()
    assert torch.equal(loss, loss2) and torch.equal(lp.grad, lp2.grad)
    assert torch.equal(lp2.grad[pad], torch.zeros(int(pad.sum())))
    assert all(torch.equal(metrics[k], metrics2[k]) for k in metrics)
    manual_high = (((new - old).exp() > 1.28) & (adv > 0) & ~pad).sum() / (~pad).sum()
    assert metrics["pg_clipfrac_high"].item() == pytest.approx(manual_high.item())


def test_policy_loss_on_policy_has_zero_kl_and_unit_ratio():
    new, _, adv, mask = batch_policy_inputs(3)
    loss, metrics = policy_loss_clip_higher(new, new.clone(), adv, mask)
    assert metrics["approx_kl"].item() == 0.0 and metrics["ratio_max"].item() == 1.0
    assert metrics["ratio_mean"].item() == 1.0 and metrics["pg_clipfrac"].item() == 0.0
    expected = -(adv * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_policy_loss_global_token_count_over_micro_batches():
    new, old, adv, mask = batch_policy_inputs(4)
    full, _ = policy_loss_clip_higher(new, old, adv, mask, clip_high=0.1)
    total = sum(policy_loss_clip_higher(new[r], old[r], adv[r], mask[r], clip_high=0.1,
                                        global_token_count=mask.sum())[0] for r in torch.arange(8).split(3))
    assert total.item() == pytest.approx(full.item(), abs=1e-6)


# --- value loss ----------------------------------------------------------------------------------------

def test_value_loss_unclipped_is_half_squared_error():
    v, mask = ragged(5)
    ret = torch.randn_like(v)
    vv = v.clone().requires_grad_(True)
    loss, metrics = value_loss(vv, v, ret, mask)
    expected = 0.5 * (((v - ret) ** 2) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["vf_clipfrac"].item() == 0.0
    assert metrics["value_mean"].item() == pytest.approx(((v * mask).sum() / mask.sum()).item())


def test_value_loss_clipping_and_pad_invariance():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    ret = torch.tensor([[1.0, 0.0, 0.0]])
    v = torch.tensor([[0.5, 1.0, 7.0]], requires_grad=True)
    loss, m = value_loss(v, old, ret, mask, clip_range=0.2)
    # token 0: unclipped 0.25, clipped (0.2−1)² = 0.64 → 0.64; token 1: unclipped 1.0, clipped 0.04 → 1.0
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)
    loss.backward()
    assert v.grad[0, 0].item() == 0.0 and v.grad[0, 1].item() == pytest.approx(0.5)
    v2 = torch.tensor([[0.5, 1.0, float("nan")]], requires_grad=True)
    loss2, _ = value_loss(v2, old, torch.tensor([[1.0, 0.0, float("inf")]]), mask, clip_range=0.2)
    loss2.backward()
    assert torch.equal(loss, loss2) and torch.equal(v.grad, v2.grad)


# --- positive-example NLL ------------------------------------------------------------------------------

def test_positive_nll_uses_correct_rows_only_with_own_denominator():
    lp, mask = ragged(6)
    lp = lp.abs().neg()
    correct = torch.tensor([True, False, True, False, False, True, False, False])
    x = lp.clone().requires_grad_(True)
    loss = positive_nll_loss(x, mask, correct)
    sel = mask * correct[:, None]
    assert loss.item() == pytest.approx((-(lp * sel).sum() / sel.sum()).item())
    loss.backward()
    assert torch.equal(x.grad[~correct], torch.zeros_like(x.grad[~correct]))
    changed = torch.where(correct[:, None], lp, torch.full_like(lp, float("nan")))
    assert torch.equal(positive_nll_loss(changed, mask, correct), loss.detach())
    as_float = positive_nll_loss(lp, mask, correct.float())
    assert as_float.item() == pytest.approx(loss.item())


def test_positive_nll_is_zero_with_grad_when_no_correct_rows_and_global_count():
    lp, mask = ragged(7, dtype=torch.float32)
    x = lp.clone().requires_grad_(True)
    loss = positive_nll_loss(x, mask, torch.zeros(8, dtype=torch.bool))
    assert loss.item() == 0.0 and loss.dtype == torch.float32 and loss.requires_grad
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    correct = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1], dtype=torch.bool)
    count = (mask * correct[:, None]).sum()
    parts = sum(positive_nll_loss(lp[r], mask[r], correct[r], global_token_count=count)
                for r in torch.arange(8).split(2))
    assert parts.item() == pytest.approx(positive_nll_loss(lp, mask, correct).item(), rel=1e-6)
    with pytest.raises(ValueError):
        positive_nll_loss(lp, mask, correct[:3])


# --- KL penalties --------------------------------------------------------------------------------------

def test_kl_penalty_estimators():
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -2.0, -0.1]])
    d = lp - ref
    assert torch.allclose(kl_penalty(lp, ref, "k1"), d)
    assert torch.allclose(kl_penalty(lp, ref, "k2"), 0.5 * d ** 2)
    k3 = kl_penalty(lp, ref, "k3")
    assert torch.allclose(k3, torch.exp(-d) - 1 + d) and (k3 >= 0).all() and k3[0, 1] == 0
    masked = kl_penalty(torch.tensor([[-1.0, float("nan")]]), torch.tensor([[-1.5, 0.0]]), "k3",
                        mask=torch.tensor([[1, 0]]))
    assert masked[0, 1] == 0 and masked[0, 0] == pytest.approx(float(torch.exp(torch.tensor(-0.5)) - 0.5))
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(lp, ref, "k9")


def test_k3_is_an_unbiased_kl_estimate_on_samples():
    g = torch.Generator().manual_seed(0)
    logits_p, logits_q = torch.randn(6, generator=g), torch.randn(6, generator=g)
    logp, logq = logits_p.log_softmax(0), logits_q.log_softmax(0)
    samples = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    exact = (logp.exp() * (logp - logq)).sum()
    for kind in ("k1", "k3"):
        est = kl_penalty(logp[samples][None], logq[samples][None], kind).mean()
        assert est.item() == pytest.approx(exact.item(), abs=0.01)
