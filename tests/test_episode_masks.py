"""Where a sequence ends vs which tokens learn (docs/design.md §3.2 and §3.14): a rollout whose response holds
tokens the environment inserted (a tool's result, loss mask 0) puts its reward on the last token the policy wrote,
counts only policy tokens in the length-adaptive λ, and GAE steps over the inserted span as one transition of the
environment — checked against values computed by hand."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from vapo_engine.algo import compute_gae
from vapo_engine.rollout.experience import from_token_ids, last_valid, place_rewards
from vapo_engine.trainer.advantages import add_advantages

# One episode: the policy writes 2 tokens, the environment inserts 2 (a tool result), the policy writes 2 more and
# stops; one column of padding. V at inserted and pad positions is junk that must not matter.
EXTENT = [1, 1, 1, 1, 1, 1, 0]
LOSS = [1, 1, 0, 0, 1, 1, 0]
V = [0.5, 0.6, 9.0, -9.0, 0.4, 0.7, 5.0]
# By hand (γ = 1, reward 1 on the last policy token, column 5); the inserted span is the environment's
# transition from state 1 to state 4, so δ_1 = r_1 + V_4 − V_1:
#   δ_5 = 1 − 0.7 = 0.3, δ_4 = 0.7 − 0.4 = 0.3, δ_1 = 0.4 − 0.6 = −0.2, δ_0 = 0.6 − 0.5 = 0.1
#   λ = 1:   A_5 = 0.3, A_4 = 0.6,  A_1 = 0.4,    A_0 = 0.5      (returns: 1 at every policy token)
#   λ = 0.5: A_5 = 0.3, A_4 = 0.45, A_1 = 0.025,  A_0 = 0.1125
#   λ = 0:   A = δ
HAND = {1.0: [0.5, 0.4, 0, 0, 0.6, 0.3, 0], 0.5: [0.1125, 0.025, 0, 0, 0.45, 0.3, 0],
        0.0: [0.1, -0.2, 0, 0, 0.3, 0.3, 0]}


def test_reward_sits_on_the_last_policy_token_not_on_an_inserted_one():
    loss = torch.tensor([LOSS, [1, 1, 0, 0, 0, 0, 0], [0] * 7], dtype=torch.float32)
    assert last_valid(loss).tolist() == [5, 1, -1]
    assert place_rewards(torch.tensor([1.0, 2.0, 3.0]), loss).tolist() == [
        [0, 0, 0, 0, 0, 1, 0], [0, 2, 0, 0, 0, 0, 0], [0] * 7]


@pytest.mark.parametrize("lam", sorted(HAND))
def test_gae_treats_inserted_tokens_as_the_environments_transition(lam):
    r = torch.tensor([[0, 0, 0, 0, 0, 1, 0]], dtype=torch.float64)
    adv, ret = compute_gae(r, torch.tensor([V], dtype=torch.float64), torch.tensor([LOSS]), lam=lam)
    assert torch.allclose(adv, torch.tensor([HAND[lam]], dtype=torch.float64), atol=1e-12)
    if lam == 1.0:
        assert ret.tolist() == [[1.0, 1.0, 0, 0, 1.0, 1.0, 0]]


def test_trainer_advantages_count_policy_tokens_and_accept_holes():
    """The whole rollout path: a triple with a loss mask (as a replayed episode), values attached, the run's
    advantages with the length-adaptive λ of 4 policy tokens (α = 0.5 → λ = 1 − 1/2 = 0.5), no whitening."""
    ro = from_token_ids([([7, 8], [10, 11, 12, 13, 14, 15], LOSS[:6]), ([7], [10, 11])], pad_id=0, device="cpu")
    assert ro.response_mask.tolist()[0] == EXTENT[:6] and ro.loss_mask.tolist()[0] == LOSS[:6]
    assert ro.token_rewards.tolist()[0] == [0, 0, 0, 0, 0, 1]
    ro = replace(ro, values=torch.tensor([V[:6], [0.2, 0.3, 0, 0, 0, 0]]))
    cfg = SimpleNamespace(
        decisions=SimpleNamespace(lambda_policy="length_adaptive", estimator="decoupled_gae", whiten_advantages=False),
        vapo=SimpleNamespace(alpha=0.5, group_size=1, lambda_critic=1.0, lambda_base=0.95))
    out, metrics = add_advantages(ro, cfg)
    assert metrics["vapo/lambda_policy_min"] == 0.0 and metrics["vapo/lambda_clamped_frac"] == 0.5  # row 2: l = 2
    assert torch.allclose(out.advantages[0], torch.tensor(HAND[0.5][:6]), atol=1e-6)
    assert out.returns[0].tolist() == pytest.approx([1, 1, 0, 0, 1, 1])
