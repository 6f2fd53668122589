"""Single-turn rollouts are unchanged bit for bit by the loss mask, verifiers and episodes (issue 37): two short
fixed-seed runs (VAPO with value pretraining, KL and replay; GRPO) on the shipped planted-stop chain model, whose
responses differ in length and are partly right, write exactly the metrics that the code before those changes
wrote (tests/data/single_turn_metrics.json, captured at commit ce800dc; timings left out)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from vapo_engine.config import load_config, load_settings
from vapo_engine.metrics import read_metrics
from vapo_engine.runs import create_run

PINNED = json.loads((ROOT / "tests" / "data" / "single_turn_metrics.json").read_text())["runs"]
ARMS = {
    "vapo": ["vapo.value_pretrain_steps=1", "training.kl_coef=0.01"],
    "grpo": ["training.algorithm=grpo", "vapo.value_pretrain_steps=0", "vapo.token_level_loss=false",
             "vapo.positive_lm_coef=0", "vapo.positive_replay=false", "vapo.clip_higher=false"],
}
BASE = ["training.total_steps=2", "training.batch_size=8", "vapo.group_size=4", "eval.num_problems=6",
        "eval.samples_per_problem=1", "eval.eval_interval=1", "eval.save_interval=100",
        "training.micro_batch_size=4", "training.mini_batch_size=8", "vapo.replay_ratio=0.5"]
TIMING = ("time", "rollout/tokens_per_s")


def pinned_view(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("perf/")} for r in records]


@pytest.mark.parametrize("arm", list(ARMS))
def test_single_turn_metrics_are_those_of_the_code_before_episodes(tmp_path, arm):
    from vapo_engine.trainer.loop import train
    cfg = load_config(ROOT / "config.toml", BASE + ARMS[arm], preset="demo-planted-stop")
    run = create_run(cfg, load_settings(ROOT / "settings.json"), tmp_path / "runs", run_id=arm).run_dir
    train(run, log=lambda m: None)
    got = pinned_view(read_metrics(run / "metrics.jsonl"))
    assert len(got) == len(PINNED[arm])
    for mine, theirs in zip(got, PINNED[arm]):
        assert mine == theirs, {k: (mine.get(k), theirs.get(k)) for k in mine.keys() | theirs.keys()
                                if mine.get(k) != theirs.get(k)}
