"""rollout.old_log_probs = "sampler" (docs/design.md §5.1, "no recomputation of what is already known"): the policy's
old log-probs and entropies are read off the hf sampler's decoding steps instead of a forward pass after
sampling. They must be what that pass computes (full vocabulary at the sampling temperature, not the top-p
truncated distribution), the sampling itself must not change, the old-output pass must then run no policy
forward, and a run with them must train like a run that recomputes. Real tiny models, real `generate`.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.engine_helpers import make_run
from tests.test_temperature import model_dir, models  # noqa: F401  (module fixtures: a spread-logit tiny model)
from vapo_engine.rollout.experience import attach_old_outputs, response_log_probs, sample_rollout
from vapo_engine.tasks import get_task


def _sample(models, temperature: float, top_p: float, policy_outputs: bool):  # noqa: F811
    task = get_task("builtin:addition")
    problems = [p for p in task.heldout(6) for _ in range(4)]  # 24 rows; answers of mixed length: some end early
    torch.manual_seed(3)
    return sample_rollout(models, task, problems, max_new_tokens=12, temperature=temperature, top_p=top_p,
                          with_policy_outputs=policy_outputs)


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.0, 1.0), (1.0, 0.8)])
def test_read_off_the_sampler_they_are_the_recomputed_ones(models, temperature, top_p):  # noqa: F811
    read = _sample(models, temperature, top_p, policy_outputs=True)
    plain = _sample(models, temperature, top_p, policy_outputs=False)
    assert torch.equal(read.input_ids, plain.input_ids)  # reading them off does not change what is sampled
    assert plain.old_log_probs is None and read.old_log_probs is not None
    recomputed = attach_old_outputs(models, plain, micro_batch=8)
    mask = read.response_mask.bool()
    assert mask.sum() > 50 and read.response_mask[:, 1:].sum() < read.response_mask[:, :-1].sum()
    for name in ("old_log_probs", "entropy"):
        diff = (getattr(read, name) - getattr(recomputed, name)).abs()[mask]
        assert float(diff.max()) <= 1e-5, f"{name}: {float(diff.max()):.2e} from the recomputed pass"
        assert float(getattr(read, name)[~mask].abs().max()) == 0.0  # nothing after a response's end
    # the reference model (the initial weights) still gets its pass
    kept = attach_old_outputs(models, read, micro_batch=8)
    assert kept.old_log_probs is read.old_log_probs
    assert torch.allclose(kept.ref_log_probs[mask], read.old_log_probs[mask], atol=1e-5)


def test_the_old_output_pass_runs_no_policy_forward(models):  # noqa: F811
    read = _sample(models, 1.0, 1.0, policy_outputs=True)
    calls = []
    hook = models.policy.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        attach_old_outputs(models, read, micro_batch=8)
    finally:
        hook.remove()
    assert calls == []


def test_top_p_truncation_is_not_in_them(models):  # noqa: F811
    """Under top-p the sampler draws from a truncated distribution; the old log-probs stay the trainer's
    (untruncated), so they differ from the truncated ones wherever the nucleus cut mass."""
    ro = sample_rollout(models, get_task("builtin:addition"), get_task("builtin:addition").heldout(8),
                        max_new_tokens=8, temperature=1.0, top_p=0.8, with_policy_outputs=True,
                        with_sampler_log_probs=True)
    mask = ro.response_mask.bool()
    assert float((ro.sampler_log_probs - ro.old_log_probs)[mask].max()) > 0.01
    with torch.no_grad():
        full, _ = response_log_probs(models.policy, ro)
    assert float((full - ro.old_log_probs).abs()[mask].max()) <= 1e-5


@pytest.mark.parametrize("over,needs", [
    (['rollout.backend="server"', 'rollout.urls=["http://127.0.0.1:9"]'], "backend hf"),
    (["rollout.max_off_policy_steps=1"], "synchronous"),
    (['rollout.is_mode="truncate"'], "no importance correction"),
])
def test_the_config_says_when_it_cannot_be(over, needs):
    from tests.conftest import ROOT
    from vapo_engine.config import load_config
    from vapo_engine.config.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "config.toml", ['rollout.old_log_probs="sampler"', *over], preset="cpu-demo")
    text = str(e.value)
    assert "rollout.old_log_probs" in text and needs in text and 'rollout.old_log_probs = "recompute"' in text


def test_a_run_reading_them_off_trains_like_one_that_recomputes(tmp_path, model_dir, monkeypatch):  # noqa: F811
    """Two steps from the same seed: the same samples, and losses and gradient norms equal to float rounding
    (only the old log-probs' source differs, by float rounding); the run that reads them off runs no old-log-prob pass
    (counted where the old-output pass calls the policy: rollout.experience.response_log_probs)."""
    from vapo_engine.rollout import experience
    from vapo_engine.trainer.loop import train
    records, passes, real = {}, {}, experience.response_log_probs
    for mode in ("recompute", "sampler"):
        calls = []
        monkeypatch.setattr(experience, "response_log_probs",
                            lambda *a, _calls=calls, **k: _calls.append(1) or real(*a, **k))
        run = make_run(tmp_path / mode, model_dir, ["training.total_steps=2", "eval.eval_interval=100",
                                                    f'rollout.old_log_probs="{mode}"'], seed=5)
        assert train(run, log=lambda s: None)["status"] == "succeeded"
        passes[mode] = len(calls)
        records[mode] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()
                         if json.loads(x).get("kind") == "train"]
    assert passes["recompute"] > 0 and passes["sampler"] == 0, passes
    a, b = records["recompute"], records["sampler"]
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert ra["rollout/prompts_digest"] == rb["rollout/prompts_digest"]
        assert ra["rollout/response_length"] == rb["rollout/response_length"]
        for k in ("actor/pg_loss", "actor/grad_norm", "critic/value_loss", "actor/entropy", "actor/approx_kl"):
            assert rb[k] == pytest.approx(ra[k], rel=1e-3, abs=1e-5), k


def test_auto_reads_them_off_only_where_sampler_and_trainer_are_one_fp32_computation(models):  # noqa: F811
    from dataclasses import replace

    from vapo_engine.config.train_model import RolloutConfig
    from vapo_engine.trainer.offpolicy import reads_old_log_probs
    auto = RolloutConfig()
    assert auto.old_log_probs == "auto" and reads_old_log_probs(auto, models)  # CPU, fp32, synchronous hf
    assert not reads_old_log_probs(auto, replace(models, autocast_dtype=torch.bfloat16))  # the CUDA default
    assert not reads_old_log_probs(RolloutConfig(max_off_policy_steps=1), models)
    assert not reads_old_log_probs(RolloutConfig(is_mode="truncate"), models)
    assert not reads_old_log_probs(RolloutConfig(backend="server", urls=["http://127.0.0.1:9"]), models)
    assert not reads_old_log_probs(RolloutConfig(old_log_probs="recompute"), models)
