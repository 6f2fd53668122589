"""Log-probs at the sampling temperature: the trainer describes the policy it samples from.

Tokens are sampled from softmax(logits / T). The trainer's old log-probs, reference log-probs and the update's
new log-probs must be of that same distribution, so that the first mini-batch's PPO ratio is exactly 1 (on
policy) at any T — not only at T = 1, where the raw logits happen to be right. The sampler's own log-probs
(log-softmax of `model.generate`'s processed scores) are the ground truth.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from vapo_engine.builtin_model import make_model_dir
from vapo_engine.rollout.experience import (
    attach_old_outputs,
    from_token_ids,
    logprob_temperature,
    response_log_probs,
    sample_rollout,
)
from vapo_engine.tasks import get_task
from vapo_engine.trainer.models import load_models


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = make_model_dir(tmp_path_factory.mktemp("temp") / "m", hidden=32, layers=2, heads=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():  # spread the logits: at T = 0.7 vs 1.0 the log-probs then differ by far more than 1e-5
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(model_dir):
    return load_models(model_dir, value_path=None, need_value=False, reference_path=model_dir,
                       device=torch.device("cpu"), autocast_dtype=None)


def _rollout(models, temperature: float):
    task = get_task("builtin:addition")
    problems = [p for p in task.heldout(6) for _ in range(4)]  # 24 rows, groups of 4, answers of mixed length
    torch.manual_seed(3)
    ro = sample_rollout(models, task, problems, max_new_tokens=12, temperature=temperature, top_p=1.0,
                        with_sampler_log_probs=True)
    return attach_old_outputs(models, ro, micro_batch=8)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_old_log_probs_are_the_samplers(models, temperature):
    ro = _rollout(models, temperature)
    mask = ro.response_mask.bool()
    assert ro.temperature == temperature and mask.sum() > 50
    assert ro.response_mask[:, 1:].sum() < ro.response_mask[:, :-1].sum()  # some rows ended early (padding)
    diff = (ro.old_log_probs - ro.sampler_log_probs).abs()[mask]
    assert float(diff.max()) <= 1e-5, f"old log-probs differ from the sampler's by {float(diff.max()):.2e}"
    # the reference model (the same initial weights) is evaluated at the same temperature
    assert torch.equal(ro.ref_log_probs[mask], ro.old_log_probs[mask])


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_first_minibatch_ratio_is_one(models, temperature):
    """The update recomputes log-probs with the policy in train mode; before any optimizer step they equal the
    old ones, so every ratio of the first mini-batch is 1."""
    ro = _rollout(models, temperature)
    models.policy.train()
    with torch.no_grad():
        new, _ = response_log_probs(models.policy, ro)
    ratio = torch.exp(new - ro.old_log_probs)[ro.response_mask.bool()]
    assert float((ratio - 1).abs().max()) <= 1e-5


def test_raw_logits_would_be_off_policy(models):
    """What the fix is for: at T = 0.7, log-probs of the raw logits (T = 1) are far from the sampler's."""
    ro = _rollout(models, 0.7)
    with torch.no_grad():
        at_one, _ = response_log_probs(models.policy, dataclasses.replace(ro, temperature=1.0))
    mask = ro.response_mask.bool()
    assert float((at_one - ro.sampler_log_probs).abs()[mask].max()) > 0.05


def test_replayed_positives_use_the_run_temperature(models):
    pairs = [([5, 6, 7], [8, 9, 2]), ([5, 6], [9, 2])]
    hot = from_token_ids(pairs, models.tokenizer.pad_token_id, "cpu", temperature=0.7)
    greedy = from_token_ids(pairs, models.tokenizer.pad_token_id, "cpu", temperature=0.0)
    assert hot.temperature == 0.7 and greedy.temperature == 1.0 == logprob_temperature(0.0)
    with torch.no_grad():
        lp_hot, _ = response_log_probs(models.policy, hot)
        lp_one, _ = response_log_probs(models.policy, greedy)
    assert not torch.allclose(lp_hot, lp_one)
