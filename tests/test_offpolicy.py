"""Off-policy rollouts in real training runs on the tiny model: the sampler–trainer log-prob mismatch is measured
and corrected by truncated / masked importance sampling (a planted backend whose log-probs are off by a
constant), stale batches are dropped and sampled again, and asynchronous rollouts stay within their bound."""
from __future__ import annotations

from typing import ClassVar

import pytest

from tests.conftest import ROOT
from tests.engine_helpers import make_run, random_value_dir
from vapo_engine.builtin_model.recipes import RECIPES
from vapo_engine.builtin_model.shipped import shipped_folder
from vapo_engine.config import load_config
from vapo_engine.errors import UserError
from vapo_engine.metrics import read_metrics
from vapo_engine.rollout.backends import register_backend
from vapo_engine.rollout.backends.hf import HfBackend

SHIPPED = shipped_folder(RECIPES["builtin:addition"])
"""The shipped built-in addition model: it answers some prompts right, so advantages and PG losses are not 0."""
MISMATCH = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/is_weight_mean", "rollout/is_clipfrac")


@register_backend("planted_offset")
class PlantedOffset(HfBackend):
    """The hf sampler, whose reported log-probs are shifted by `OFFSET` on every valid token (a server whose
    numerics differ from the trainer's)."""

    name = "planted_offset"
    OFFSET: ClassVar[float] = -1.0

    def generate(self, models, prompt_ids, params, *, batch_size=None):
        gen = super().generate(models, prompt_ids, params, batch_size=batch_size)
        if gen.log_probs is not None:
            gen.log_probs = gen.log_probs + PlantedOffset.OFFSET * gen.response_mask
        return gen


@register_backend("stale_weights")
class StaleWeights(HfBackend):
    """The hf sampler, claiming to have sampled with weights version 0 on the calls listed in `STALE` (0-based,
    counting rollouts, i.e. calls that ask for log-probs): a replica that had not loaded the new weights."""

    name = "stale_weights"
    STALE: ClassVar[set[int]] = set()
    calls: ClassVar[int] = 0

    def generate(self, models, prompt_ids, params, *, batch_size=None):
        gen = super().generate(models, prompt_ids, params, batch_size=batch_size)
        if params.log_probs:
            if StaleWeights.calls in StaleWeights.STALE:
                gen.weight_version = 0
            StaleWeights.calls += 1
        return gen


def _train(tmp_path, model_dir, extra, name):
    """The train records of a short real run (2 policy steps unless `extra` says otherwise)."""
    from vapo_engine.trainer.loop import train
    run = make_run(tmp_path, model_dir, ["training.total_steps=2", "model.top_p=1.0", "eval.num_problems=1", *extra],
                   name=name)
    assert train(run, log=lambda m: None)["status"] == "succeeded"
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def test_planted_log_prob_offset_is_measured_and_its_weights_capped(tmp_path):
    # The actor's gradient is the PG term alone (no positive NLL, no KL), with advantages that are not 0 (a value
    # model with a random head), so the weights show in actor/grad_norm: a uniform weight w scales it by w.
    value = random_value_dir(tmp_path, SHIPPED)
    common = ["training.total_steps=1", "vapo.positive_lm_coef=0", "vapo.value_pretrain_steps=0",
              f'model.value_path="{value}"']

    def first(extra, name):
        return _train(tmp_path, SHIPPED, common + extra, name)[0]
    # hf asked to correct: its own sampling log-probs match the trainer's (≈ 0) and the weights are ≈ 1.
    hf = first(['rollout.is_mode="truncate"'], "hf")
    assert hf["rollout/logprob_diff_max"] < 1e-4 and hf["rollout/is_clipfrac"] == 0.0 and hf["actor/grad_norm"] > 0
    assert hf["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4) and hf["rollout/weight_version_lag"] == 0
    # Sampler log-probs 1 lower than the trainer's: ratio e > cap 2 on every token, so every weight is 2 — on
    # the very tokens hf sampled (same seeds, same sampler): the gradient doubles.
    PlantedOffset.OFFSET = -1.0
    off = first(['rollout.backend="planted_offset"'], "offset")  # is_mode auto = truncate
    assert off["rollout/logprob_diff_mean"] == pytest.approx(1.0, abs=1e-4)
    assert off["rollout/logprob_diff_max"] == pytest.approx(1.0, abs=1e-4)
    assert off["rollout/is_weight_mean"] == pytest.approx(2.0) and off["rollout/is_clipfrac"] == 1.0
    assert off["rollout/response_length"] == hf["rollout/response_length"]
    assert off["actor/grad_norm"] == pytest.approx(2 * hf["actor/grad_norm"], rel=1e-3)
    # mask: ratios outside [1/2, 2] give no gradient at all ...
    masked = first(['rollout.backend="planted_offset"', 'rollout.is_mode="mask"'], "mask")
    assert masked["rollout/is_weight_mean"] == 0.0 and masked["rollout/is_clipfrac"] == 1.0
    assert masked["actor/grad_norm"] == 0.0
    # ... and a ratio inside (e^−0.25 = 0.7788) keeps its weight.
    PlantedOffset.OFFSET = 0.25
    inside = first(['rollout.backend="planted_offset"', 'rollout.is_mode="mask"'], "inside")
    assert inside["rollout/is_weight_mean"] == pytest.approx(0.7788, abs=1e-3) and inside["rollout/is_clipfrac"] == 0
    assert inside["actor/grad_norm"] == pytest.approx(0.7788 * hf["actor/grad_norm"], rel=1e-3)


def test_hf_default_asks_for_nothing_and_logs_lag_zero(tmp_path, model_dir):
    cfg = load_config(ROOT / "config.toml", [])
    assert cfg.rollout.is_mode_used == "off" and not cfg.rollout.wants_sampler_log_probs
    recs = _train(tmp_path, model_dir, [], "default")
    assert all(r["rollout/weight_version_lag"] == 0 and r["rollout/dropped_stale"] == 0 for r in recs)
    assert not any(k in r for r in recs for k in MISMATCH)


def test_rollout_settings_are_checked_with_the_key_and_the_fix():
    from vapo_engine.config import ConfigError

    def problem(*over):
        with pytest.raises(ConfigError) as ei:
            load_config(ROOT / "config.toml", list(over))
        return str(ei.value)
    assert "rollout.is_cap" in problem("rollout.is_cap=1.0")
    assert "rollout.is_mode" in problem('rollout.is_mode="clip"')
    assert "rollout.max_off_policy_steps" in problem("rollout.max_off_policy_steps=-1")
    msg = problem("rollout.max_off_policy_steps=1", "distributed.nproc_per_node=2")
    assert "rollout.max_off_policy_steps" in msg and "one process" in msg
    auto = load_config(ROOT / "config.toml", ['rollout.backend="planted_offset"'])
    assert auto.decisions.importance_sampling == "truncate" and auto.rollout.wants_sampler_log_probs
    assert load_config(ROOT / "config.toml", []).decisions.importance_sampling == "off"
    hf_async = load_config(ROOT / "config.toml", ["rollout.max_off_policy_steps=2"]).rollout
    assert hf_async.is_mode_used == "truncate" and hf_async.wants_sampler_log_probs
    hf_off = load_config(ROOT / "config.toml", ["rollout.max_off_policy_steps=2", 'rollout.is_mode="off"']).rollout
    assert hf_off.is_mode_used == "off" and hf_off.wants_sampler_log_probs  # still measured, not corrected


def test_config_check_warns_about_uncorrected_or_nucleus_skewed_weights():
    from vapo_engine.config.effective import config_warnings

    def warned(*over):
        return [str(w) for w in config_warnings(load_config(ROOT / "config.toml", list(over)))
                if w.key == "rollout.is_mode"]
    assert warned() == [] and warned("model.top_p=1.0", "rollout.max_off_policy_steps=1") == []
    assert "top_p = 0.95 nucleus" in warned("rollout.max_off_policy_steps=1")[0]  # the shipped top_p
    assert "uncorrected" in warned("model.top_p=1.0", "rollout.max_off_policy_steps=1", 'rollout.is_mode="off"')[0]


def test_a_stale_batch_is_dropped_and_sampled_again(tmp_path, model_dir):
    # calls: value-pretraining round, policy rollout 0, policy rollout 1 (current version 1) <- stale once
    StaleWeights.calls, StaleWeights.STALE = 0, {2}
    recs = _train(tmp_path, model_dir, ['rollout.backend="stale_weights"'], "stale")
    assert [r["rollout/dropped_stale"] for r in recs] == [0, 8]  # batch_size 8, sampled again at once
    assert all(r["rollout/weight_version_lag"] == 0 for r in recs) and StaleWeights.calls == 4
    # A backend that keeps answering with old weights is an error that says what to check.
    StaleWeights.calls, StaleWeights.STALE = 0, set(range(2, 100))
    with pytest.raises(UserError, match=r"weights version 0, 1 versions behind the policy .* did not load"):
        _train(tmp_path, model_dir, ['rollout.backend="stale_weights"'], "always-stale")


def test_async_rollouts_stay_within_one_version(tmp_path, model_dir):
    value = random_value_dir(tmp_path, model_dir)  # non-zero advantages: every update moves the policy
    extra = ["rollout.max_off_policy_steps=1", "training.total_steps=4", "training.learning_rate=5e-4",
             f'model.value_path="{value}"']
    recs = _train(tmp_path, model_dir, extra, "async")
    lags = [r["rollout/weight_version_lag"] for r in recs]
    assert len(recs) == 4 and lags == [0, 1, 1, 1] and all(r["rollout/dropped_stale"] == 0 for r in recs)
    # The first rollout is sampled synchronously (the sampler's log-probs are the trainer's); the next ones by a
    # frozen copy of the weights one update older, which the importance weights see.
    assert recs[0]["rollout/logprob_diff_max"] < 1e-5
    assert all(r["rollout/logprob_diff_max"] > 1e-3 for r in recs[1:])
    assert all(0.5 < r["rollout/is_weight_mean"] < 2 for r in recs)
    # The thread draws from the step's own seeded stream, and the update draws nothing: reproducible.
    again = _train(tmp_path, model_dir, extra, "async-again")
    assert [_no_perf(r) for r in again] == [_no_perf(r) for r in recs]


def _no_perf(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "time" and not k.startswith("perf/") and k != "rollout/tokens_per_s"}


def test_prefetch_samples_from_the_weights_as_they_were_when_it_started(tmp_path, model_dir):
    """The update that runs while the next rollout is sampled changes the live policy in place; the rollout
    is drawn from the frozen copy made when the prefetch started: its log-probs are the old weights'."""
    import copy

    import torch

    from vapo_engine.rollout.experience import response_log_probs
    from vapo_engine.trainer.setup import build_trainer
    run = make_run(tmp_path, model_dir, ["rollout.max_off_policy_steps=1", "model.top_p=1.0"], name="prefetch")
    tr = build_trainer(run, write=False, log=lambda m: None)
    try:
        before = copy.deepcopy(tr.models.policy)
        tr.prefetch.start(tr, "policy", 0)
        with torch.no_grad():  # as an optimizer step would, while the thread samples
            for p in tr.models.policy.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        tr.prefetch.finish()
        assert tr.prefetch.take("policy", 1) is None  # only the rollout it was started for
        ro = tr.prefetch.take("policy", 0)
        assert ro.weight_version == 0 and tr.prefetch.take("policy", 0) is None
        mask = ro.response_mask.bool()
        with torch.no_grad():
            old, _ = response_log_probs(before, ro)
            live, _ = response_log_probs(tr.models.policy, ro)
        assert (old - ro.sampler_log_probs).abs()[mask].max() < 1e-5
        assert (live - ro.sampler_log_probs).abs()[mask].max() > 1e-2
    finally:
        tr.prefetch.close()
        tr.logger.close()
