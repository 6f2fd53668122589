"""Single-turn rollouts are unchanged bit for bit by the loss mask, verifiers and episodes (docs/design.md §3.14): two short
fixed-seed runs (VAPO with value pretraining, KL and replay; GRPO) on the shipped planted-stop chain model, whose
responses differ in length and are partly right, write exactly the metrics that main wrote before those changes
(tests/data/single_turn_metrics.json; timings left out). The record is made by this file run from a checkout of
that main commit: `python -m tests.test_single_turn_pin OUT.json COMMIT` (from that checkout's root)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vapo_engine.config import load_config, load_settings
from vapo_engine.metrics import read_metrics
from vapo_engine.runs import create_run

PINNED_FILE = ROOT / "tests" / "data" / "single_turn_metrics.json"
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


def run_arm(arm: str, folder: Path) -> list[dict]:
    from vapo_engine.trainer.loop import train
    cfg = load_config(ROOT / "config.toml", BASE + ARMS[arm], preset="demo-planted-stop")
    run = create_run(cfg, load_settings(ROOT / "settings.json"), folder / "runs", run_id=arm).run_dir
    train(run, log=lambda m: None)
    return pinned_view(read_metrics(run / "metrics.jsonl"))


@pytest.mark.parametrize("arm", list(ARMS))
def test_single_turn_metrics_are_those_of_the_code_before_episodes(tmp_path, arm):
    pinned = json.loads(PINNED_FILE.read_text())["runs"][arm]
    got = run_arm(arm, tmp_path)
    assert len(got) == len(pinned)
    for mine, theirs in zip(got, pinned):
        assert mine == theirs, {k: (mine.get(k), theirs.get(k)) for k in mine.keys() | theirs.keys()
                                if mine.get(k) != theirs.get(k)}


if __name__ == "__main__":  # capture the record from the code of the current checkout
    out, commit = Path(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {arm: run_arm(arm, Path(tmp) / arm) for arm in ARMS}
    out.write_text(json.dumps({"about": __doc__.split("(tests/data")[0].strip().replace("\n", " "), "commit": commit,
                               "runs": runs}, indent=1, sort_keys=True) + "\n")
