"""Named random streams: ablation rows with the same seed are paired on their policy-step prompts.

Value pretraining draws its own prompts and samples; with one shared generator it would shift every later
policy-step prompt, and rows with and without it would not see the same problems. Real runs, read back from
their metrics (`rollout/prompts_digest`).
"""
from __future__ import annotations

from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics
from vapo_engine.trainer import streams
from vapo_engine.variants import VARIANTS

STEPS = ["training.total_steps=3", "eval.eval_interval=100", "eval.save_interval=100", "vapo.value_pretrain_steps=2"]


def _digests(run_dir, kind: str) -> list[float]:
    return [r["rollout/prompts_digest"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def _train(tmp_path, model_dir, variant: str, seed: int):
    from vapo_engine.trainer.loop import train
    run = make_run(tmp_path, model_dir, [*STEPS, *VARIANTS[variant].overrides], name=f"{variant}-{seed}", seed=seed)
    train(run, log=lambda m: None)
    return run


def test_rows_with_the_same_seed_draw_the_same_policy_prompts(tmp_path, model_dir):
    vapo = _train(tmp_path, model_dir, "vapo", 5)
    no_vp = _train(tmp_path, model_dir, "no_value_pretrain", 5)
    grpo = _train(tmp_path, model_dir, "grpo", 5)
    other_seed = _train(tmp_path, model_dir, "vapo", 6)
    policy = _digests(vapo, "train")
    assert len(policy) == 3 and len(set(policy)) == 3  # three steps, three different prompt lists
    assert len(_digests(vapo, "pretrain")) == 2 and not set(_digests(vapo, "pretrain")) & set(policy)
    assert _digests(no_vp, "pretrain") == [] and _digests(no_vp, "train") == policy  # pretraining shifted nothing
    assert _digests(grpo, "train") == policy
    assert not set(_digests(other_seed, "train")) & set(policy)


def test_stream_seeds_are_stable_and_separate():
    assert streams.seed_of(1, "policy_prompts", 0) == streams.seed_of(1, "policy_prompts", 0)
    seeds = {streams.seed_of(1, n, i) for n in ("policy_prompts", "pretrain_prompts", "sampling") for i in (0, 1)}
    assert len(seeds) == 6 and all(0 <= s < 2**63 for s in seeds)
    assert streams.rng(1, "replay", 3).random() == streams.rng(1, "replay", 3).random()
