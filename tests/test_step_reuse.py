"""docs/design.md §5.1: the cheaper VAPO step computes the same update. The first update's forward pass kept from
the old-output pass (trainer/first_forward.py) gives bit-identical gradients and metrics with one forward pass
fewer per model; replayed positives riding in the actor's micro-batches (one forward, one backward with the
policy loss) give the gradient of separate passes; value pretraining runs no policy pass. Real tiny models (a
random value head, so every value gradient is non-zero)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.test_memory import PAIRS, _spec

REPLAY = [([7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]), ([3], [4, 5]), ([21, 22, 23], [24, 25, 26])]
"""Replayed (prompt, response) pairs, one wider than any row of PAIRS in both the prompt and the response."""


@pytest.fixture(scope="module")
def models(model_dir, tmp_path_factory):
    from bench.lib.runs import random_head_value_dir
    from vapo_engine.trainer.models import load_models
    value = random_head_value_dir(model_dir, tmp_path_factory.mktemp("value") / "v")
    return load_models(model_dir, value_path=value, need_value=True, reference_path=None,
                       device=torch.device("cpu"), autocast_dtype=None)


def _rollout():
    from vapo_engine.rollout.experience import from_token_ids
    ro = from_token_ids(PAIRS, 0, "cpu")
    return replace(ro, correct=torch.tensor([1, 0, 1, 0, 1, 0, 0, 1], dtype=torch.bool))


def _targets(ro):
    """Advantages and returns with some signal (seeded), so every loss term has a gradient."""
    g = torch.Generator().manual_seed(1)
    noise = (lambda: torch.randn(ro.response_mask.shape, generator=g) * ro.response_mask)
    return replace(ro, advantages=noise(), returns=noise())


def _forwards(models):
    calls = {"policy": 0, "value": 0}
    hooks = [m.register_forward_pre_hook(lambda *a, _k=k: calls.__setitem__(_k, calls[_k] + 1))
             for k, m in (("policy", models.policy), ("value", models.value))]
    return calls, hooks


def _update(models, mini, spec, replay=None, first=None):
    """One update_step with lr 0 (weights stay put); (metrics, gradients, forward calls per model)."""
    from vapo_engine.trainer.update import update_step
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (models.policy, models.value)]
    calls, hooks = _forwards(models)
    metrics = update_step(models, *opts, mini, replay, spec, first=first)
    metrics = {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # wall times differ run to run
    for h in hooks:
        h.remove()
    grads = {f"{k}.{n}": p.grad.clone() for k, m in (("policy", models.policy), ("value", models.value))
             for n, p in m.named_parameters() if p.grad is not None}
    return metrics, grads, calls


@pytest.mark.parametrize("split", [{"micro_batch": 3}, {"micro_batch": 8, "micro_batch_tokens": 20}])
def test_the_kept_first_forward_is_the_old_pass_and_gives_the_same_gradients(models, split):
    from vapo_engine.rollout.experience import attach_old_outputs
    from vapo_engine.trainer.first_forward import old_outputs
    spec = _spec(positive_lm_coef=0.1, value_clip=0.2, max_grad_norm=1e6, **split)
    ro, first_mini = _rollout(), torch.tensor([6, 1, 3, 0, 7, 4])  # the first mini-batch, shuffled
    plain = attach_old_outputs(models, ro, 8)
    calls, hooks = _forwards(models)
    kept_ro, first = old_outputs(models, ro, 8, first_mini, spec, lambda n: n)
    for h in hooks:
        h.remove()
    assert calls == {"policy": 2, "value": 2}  # the first micro-batch with gradients, the other rows without
    assert first.log_probs.requires_grad and first.values.requires_grad
    m = ro.response_mask
    for name in ("old_log_probs", "entropy", "values"):
        assert torch.allclose(getattr(kept_ro, name) * m, getattr(plain, name) * m, atol=1e-5), name
    mini = _targets(kept_ro).rows(first_mini)
    from vapo_engine.trainer.update import micro_batches
    mb = next(micro_batches(mini, spec))
    assert first.serves(mb) and torch.equal(mb.old_log_probs, first.log_probs.detach())  # ratio exactly 1
    assert torch.equal(mb.values, first.values.detach())
    reused = _update(models, mini, spec, first=first)
    fresh = _update(models, mini, spec)
    assert reused[2]["policy"] == fresh[2]["policy"] - 1 and reused[2]["value"] == fresh[2]["value"] - 1
    assert reused[0] == fresh[0] and reused[1].keys() == fresh[1].keys()
    assert all(torch.equal(reused[1][k], fresh[1][k]) for k in fresh[1])  # bit for bit
    assert any(g.abs().sum() > 0 for k, g in fresh[1].items() if k.startswith("value.model"))


def test_a_first_forward_of_other_rows_is_not_used(models):
    from vapo_engine.trainer.first_forward import old_outputs
    spec = _spec(micro_batch=3, positive_lm_coef=0.1)
    ro, first = old_outputs(models, _rollout(), 8, torch.tensor([0, 1, 2, 3]), spec, lambda n: n)
    mini = _targets(ro).rows(torch.tensor([4, 5, 6, 7]))
    assert _update(models, mini, spec, first=first)[2] == _update(models, mini, spec)[2]


def _separate_passes(models, mini, replay, spec):
    """The reference: each micro-batch's losses and the replayed rows' NLL from their own forward passes."""
    from vapo_engine.algo import get_policy_loss, positive_nll_loss
    from vapo_engine.rollout.experience import response_log_probs
    from vapo_engine.trainer.update import micro_batches
    models.policy.zero_grad(set_to_none=True)
    m = mini.response_mask
    n_tok, n_pos = m.sum(), (m * mini.correct[:, None]).sum() + replay.response_mask.sum()
    for mb in micro_batches(mini, spec):
        lp = response_log_probs(models.policy, mb)[0]
        pg, _ = get_policy_loss(spec.policy_loss)(
            lp, mb.old_log_probs, mb.advantages, mb.response_mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
            dual_clip=spec.dual_clip, reduction=spec.reduction, global_token_count=n_tok, global_seq_count=mini.size)
        (pg + 0.1 * positive_nll_loss(lp, mb.response_mask, mb.correct, global_token_count=n_pos)).backward()
    lp = response_log_probs(models.policy, replay)[0]
    (0.1 * positive_nll_loss(lp, replay.response_mask, replay.correct, global_token_count=n_pos)).backward()
    return {n: p.grad.clone() for n, p in models.policy.named_parameters()}


@pytest.mark.parametrize("micro_batch", [3, 8])
def test_replayed_rows_riding_in_micro_batches_give_the_separate_passes_gradient(models, micro_batch):
    from vapo_engine.rollout.experience import attach_old_outputs, from_token_ids
    spec = _spec(micro_batch=micro_batch, positive_lm_coef=0.1, max_grad_norm=1e6)
    mini = _targets(attach_old_outputs(models, _rollout(), 8))
    mini = replace(mini, old_log_probs=mini.old_log_probs - 0.5 * mini.advantages)  # some ratios clip
    replay = attach_old_outputs(models, from_token_ids(REPLAY, 0, "cpu"), 8)
    metrics, grads, calls = _update(models, mini, spec, replay=replay)
    assert calls["policy"] == -(-8 // micro_batch)  # no pass of its own for the replayed rows
    expected = _separate_passes(models, mini, replay, spec)
    for n, g in expected.items():
        assert torch.allclose(grads[f"policy.{n}"], g, rtol=1e-4, atol=1e-7), n
    assert metrics["actor/positive_nll"] > 0 and metrics["actor/pg_clipfrac"] > 0


def test_value_pretraining_takes_no_policy_pass(models):
    from vapo_engine.rollout.experience import attach_old_outputs
    calls, hooks = _forwards(models)
    ro = attach_old_outputs(models, _rollout(), 3, policy=False)
    for h in hooks:
        h.remove()
    assert calls == {"policy": 0, "value": 3} and ro.old_log_probs is None and ro.values is not None


def test_reuse_is_off_where_it_would_cost_memory_or_not_be_exact():
    from tests.conftest import ROOT
    from vapo_engine.config import load_config
    from vapo_engine.trainer.first_forward import reuse_possible
    cfg = (lambda *o: load_config(ROOT / "config.toml", list(o)))
    assert reuse_possible(cfg(), sharded=False) and not reuse_possible(cfg(), sharded=True)
    assert not reuse_possible(cfg("training.gradient_checkpointing=true"), sharded=False)
    assert not reuse_possible(cfg("lora.enabled=true", "lora.dropout=0.1"), sharded=False)
    assert reuse_possible(cfg("lora.enabled=true"), sharded=False)
