"""GAE, Decoupled-GAE, Length-Adaptive λ, reward placement, value alignment and GRPO advantages (docs/design.md §3).
Reward placement and value alignment are the rollout's own (`vapo_engine.rollout.experience`)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from vapo_engine.algo import (
    check_right_padded,
    compute_gae,
    decoupled_gae,
    grpo_advantages,
    lambda_from_lengths,
    length_adaptive_lambda,
)
from vapo_engine.rollout.experience import from_token_ids, place_rewards, response_values

# docs/design.md §3.11 reference row (γ = 1): reward on the last valid token, two pads with junk values.
R = [0, 0, 0, 0, 1, 0, 0]
V = [0.5, 0.6, 0.4, 0.7, 0.9, 5.0, -3.0]
M = [1, 1, 1, 1, 1, 0, 0]
SPEC_ADV = {
    1.0: [0.5, 0.4, 0.6, 0.3, 0.1],
    0.95: [0.433676, 0.351237, 0.58025, 0.295, 0.1],
    0.5: [0.10625, 0.0125, 0.425, 0.25, 0.1],
    0.0: [0.1, -0.2, 0.3, 0.2, 0.1],
}


def _row(x, dtype=torch.float64):
    return torch.tensor([x], dtype=dtype)


def ref_gae(rewards, values, mask, gamma, lam):
    """Plain-Python GAE over the valid positions of each row (holes skipped), 0 at pads."""
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for b, (r, v, m) in enumerate(zip(rewards, values, mask)):
        lam_b = lam[b] if isinstance(lam, (list, tuple)) else lam
        next_v, next_a = 0.0, 0.0
        for t in reversed([t for t in range(len(r)) if m[t]]):
            next_a = r[t] + gamma * next_v - v[t] + gamma * lam_b * next_a
            next_v = v[t]
            adv[b][t], ret[b][t] = next_a, next_a + v[t]
    return adv, ret


def random_batch(seed, batch=6, length=11, holes=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    lengths[0], lengths[1] = length, 1  # always one full row and one single-token row
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    if holes:
        mask = mask * (torch.rand(batch, length, generator=g) > 0.3)
    rewards = torch.randn(batch, length, generator=g, dtype=torch.float64)
    values = torch.randn(batch, length, generator=g, dtype=torch.float64)
    return rewards, values, mask


@pytest.mark.parametrize("lam", sorted(SPEC_ADV))
def test_spec_reference_vectors(lam):
    adv, ret = compute_gae(_row(R), _row(V), _row(M), gamma=1.0, lam=lam)
    assert torch.allclose(adv[0, :5], torch.tensor(SPEC_ADV[lam], dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.allclose(ret[0, :5], adv[0, :5] + _row(V)[0, :5], atol=1e-12)
    assert torch.equal(adv[0, 5:], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(ret[0, 5:], torch.zeros(2, dtype=torch.float64))


def test_spec_reference_returns_lambda_one_are_monte_carlo():
    _, ret = compute_gae(_row(R), _row(V), _row(M), gamma=1.0, lam=1.0)
    assert torch.allclose(ret[0, :5], torch.ones(5, dtype=torch.float64), atol=1e-6)


def test_float32_inputs_reproduce_reference_and_bool_mask_equals_float_mask():
    args = (_row(R, torch.float32), _row(V, torch.float32))
    adv_f, ret_f = compute_gae(*args, _row(M, torch.float32), lam=0.95)
    adv_b, ret_b = compute_gae(*args, _row(M).bool(), lam=0.95)
    assert torch.equal(adv_f, adv_b) and torch.equal(ret_f, ret_b)
    assert adv_f.dtype == torch.float32
    assert torch.allclose(adv_f[0, :5].double(), torch.tensor(SPEC_ADV[0.95], dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("junk", [float("nan"), float("inf"), -1e6, 123.0])
def test_pad_values_and_rewards_never_change_any_output(junk):
    rewards, values, mask = random_batch(3)
    adv, ret = compute_gae(rewards, values, mask, lam=0.9)
    pad = mask == 0
    r2 = torch.where(pad, torch.full_like(rewards, junk), rewards)
    v2 = torch.where(pad, torch.randn_like(values) * 1e3 if junk == 123.0 else torch.full_like(values, junk), values)
    adv2, ret2 = compute_gae(r2, v2, mask, lam=0.9)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert torch.equal(adv[pad], torch.zeros_like(adv[pad])) and torch.equal(ret[pad], torch.zeros_like(ret[pad]))


def test_reward_on_first_pad_is_ignored_eos_plus_one_pitfall():
    r_eos1 = _row([0, 0, 0, 0, 0, 1, 0])  # reward one past the last valid token
    adv, _ = compute_gae(r_eos1, _row(V), _row(M), lam=1.0)
    adv0, _ = compute_gae(torch.zeros(1, 7, dtype=torch.float64), _row(V), _row(M), lam=1.0)
    assert torch.equal(adv, adv0)
    placed = place_rewards(torch.tensor([1.0]), _row(M, torch.float32))
    assert torch.equal(placed, _row(R, torch.float32))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_per_sequence_lambda_equals_each_row_alone(seed):
    rewards, values, mask = random_batch(seed)
    lams = torch.rand(rewards.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, mask, gamma=0.97, lam=lams)
    for b in range(rewards.shape[0]):
        a_b, r_b = compute_gae(rewards[b:b + 1], values[b:b + 1], mask[b:b + 1], gamma=0.97, lam=float(lams[b]))
        assert torch.equal(adv[b:b + 1], a_b) and torch.equal(ret[b:b + 1], r_b)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("holes", [False, True])
def test_vectorised_matches_plain_loop(seed, holes):
    rewards, values, mask = random_batch(seed, holes=holes)
    gamma = [1.0, 0.99, 0.9, 0.5, 1.0][seed]
    lams = [round(0.1 + 0.15 * b, 2) for b in range(rewards.shape[0])]
    for lam in (0.0, 0.73, 1.0, lams):
        lam_arg = torch.tensor(lams, dtype=torch.float64) if isinstance(lam, list) else lam
        adv, ret = compute_gae(rewards, values, mask, gamma=gamma, lam=lam_arg)
        ref_a, ref_r = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
        assert torch.allclose(adv, torch.tensor(ref_a, dtype=torch.float64), atol=1e-10)
        assert torch.allclose(ret, torch.tensor(ref_r, dtype=torch.float64), atol=1e-10)


def test_lambda_one_gamma_one_gives_monte_carlo_returns():
    rewards, values, mask = random_batch(7)
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    valid_r = rewards * mask
    mc = valid_r.flip(-1).cumsum(-1).flip(-1) * mask  # Σ_{t' ≥ t} r_t' over valid tokens
    assert torch.allclose(ret, mc, atol=1e-10)
    assert torch.allclose(adv, (mc - values) * mask, atol=1e-10)


def test_outputs_carry_no_grad_and_bad_lambda_is_rejected():
    rewards, values, mask = random_batch(1)
    values = values.clone().requires_grad_(True)
    adv, ret = compute_gae(rewards, values, mask, lam=0.5)
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError, match="negative"):
        compute_gae(rewards, values, mask, lam=-0.1)
    with pytest.raises(ValueError, match="shape"):
        compute_gae(rewards, values, mask, lam=torch.ones(3))
    with pytest.raises(ValueError):
        compute_gae(rewards, values, mask, lam=1.5)


def test_decoupled_gae_critic_returns_come_from_lambda_critic_pass():
    rewards, values, mask = random_batch(5)
    lam_p = torch.linspace(0.2, 0.9, rewards.shape[0], dtype=torch.float64)
    pol_adv, critic_ret = decoupled_gae(rewards, values, mask, lam_policy=lam_p, lam_critic=1.0)
    adv_p, ret_p = compute_gae(rewards, values, mask, lam=lam_p)
    _, ret_c = compute_gae(rewards, values, mask, lam=1.0)
    assert torch.equal(pol_adv, adv_p)
    assert torch.equal(critic_ret, ret_c)
    assert not torch.allclose(critic_ret, ret_p)  # the pitfall: returns of the λ_policy pass
    mc = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    assert torch.allclose(critic_ret, mc, atol=1e-10)


def test_decoupled_gae_on_spec_row():
    pol, crit = decoupled_gae(_row(R), _row(V), _row(M), lam_policy=0.95)
    assert torch.allclose(pol[0, :5], torch.tensor(SPEC_ADV[0.95], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(crit[0, :5], torch.ones(5, dtype=torch.float64), atol=1e-6)


def test_length_adaptive_lambda_schedule():
    alpha = 0.05  # 1/α = 20 tokens
    lengths = [0, 1, 10, 19, 20, 21, 40, 100, 1000]
    mask = (torch.arange(1000)[None, :] < torch.tensor(lengths)[:, None])
    lam, clamped = length_adaptive_lambda(mask, alpha)
    assert lam.shape == (len(lengths),) and clamped.dtype == torch.bool
    assert (lam >= 0).all() and (lam <= 1).all()
    expected = [max(0.0, 1 - 1 / (alpha * n)) if n else 0.0 for n in lengths]
    assert torch.allclose(lam.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-7)
    assert clamped.tolist() == [n <= 20 for n in lengths]
    assert torch.equal(lam[clamped], torch.zeros(int(clamped.sum())))
    assert lam[-2] == pytest.approx(0.8) and lam[-1] == pytest.approx(0.98)


def test_length_adaptive_lambda_float_mask_and_lengths_helper_agree():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    lam_f, cl_f = length_adaptive_lambda(mask, 0.5)
    lam_b, cl_b = length_adaptive_lambda(mask.bool(), 0.5)
    lam_l, cl_l = lambda_from_lengths(torch.tensor([4, 6, 1]), 0.5)
    assert torch.equal(lam_f, lam_b) and torch.equal(lam_f, lam_l) and torch.equal(cl_f, cl_l)
    assert torch.equal(cl_f, cl_b)
    assert lam_f.tolist() == pytest.approx([0.5, 1 - 1 / 3, 0.0])
    assert cl_f.tolist() == [False, False, True]
    with pytest.raises(ValueError):
        length_adaptive_lambda(mask, 0.0)


def test_length_adaptive_lambda_rejects_left_padded_attention_mask():
    left_padded = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        length_adaptive_lambda(left_padded, 0.5)
    with pytest.raises(ValueError, match="right-padded"):
        check_right_padded(left_padded)
    check_right_padded(torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]]))


def test_rewards_placed_on_last_valid_token_ragged():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    out = place_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    expected = torch.tensor([[0, 0, 1, 0], [2, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]], dtype=torch.float32)
    assert torch.equal(out, expected)


def test_response_values_read_the_position_before_each_token():
    def position_values(input_ids, **_):  # a value model whose value is the position in the padded sequence
        n, length = input_ids.shape
        return SimpleNamespace(logits=torch.arange(length, dtype=torch.float32).expand(n, length)[..., None])
    ro = from_token_ids([([5, 6, 7], [8, 9, 10, 11]), ([12], [13, 14])], pad_id=0, device="cpu")
    assert ro.prompt_len == 3  # response tokens at positions 3..6 of the 7-position sequence
    assert torch.equal(response_values(position_values, ro), torch.tensor([[2.0, 3.0, 4.0, 5.0]] * 2))


def test_grpo_group_normalised_advantages():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3, 1, 4, 2, 5, 5, 1])[:, None])
    adv = grpo_advantages(scores, mask, group_size=4)
    groups = scores.view(2, 4)
    ref = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).flatten()
    assert torch.allclose(adv, ref[:, None].expand(8, 5) * mask, atol=1e-6)
    assert torch.equal(adv[~mask], torch.zeros(int((~mask).sum())))
    first = adv[0, 0].item()
    assert first == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-5)
    no_std = grpo_advantages(scores, mask, group_size=4, norm_by_std=False)
    assert torch.allclose(no_std[:, 0], (groups - groups.mean(1, keepdim=True)).flatten())


def test_grpo_identical_scores_give_zero_not_nan_and_bad_groups_raise():
    adv = grpo_advantages(torch.ones(4), torch.ones(4, 3), group_size=2)
    assert torch.equal(adv, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.ones(6), torch.ones(6, 3), group_size=4)
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.ones(6), torch.ones(6, 3), group_size=1)
