"""The default demo (`bash scripts/demo.sh` = preset demo-planted-stop): the preset starts from a shipped model (no
build), and a run of it, cut down in size, prints the critic's held-out EV at every evaluation after value
pretraining (not at the start, where the critic has not trained), through the worker as the demo runs it."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from vapo_engine.builtin_model.recipes import RECIPES
from vapo_engine.builtin_model.shipped import shipped_folder
from vapo_engine.config import load_config, load_settings
from vapo_engine.metrics import read_metrics
from vapo_engine.runs import create_run

SMALL = ["training.total_steps=2", "training.batch_size=8", "training.mini_batch_size=8", "vapo.value_pretrain_steps=1",
         "eval.eval_interval=2", "eval.num_problems=14"]


def test_demo_sh_runs_the_demo_preset_on_a_shipped_model():
    assert "--preset demo-planted-stop" in (ROOT / "scripts" / "demo.sh").read_text()
    cfg = load_config(ROOT / "config.toml", preset="demo-planted-stop")
    assert cfg.model.local_path is None and (shipped_folder(RECIPES[cfg.model.builtin]) / "config.json").is_file()
    assert cfg.decisions.uses_critic and cfg.eval.samples_per_problem >= 1  # the held-out EV needs sampled answers


def test_a_small_demo_run_prints_the_critics_held_out_ev(tmp_path):
    cfg = load_config(ROOT / "config.toml", SMALL, preset="demo-planted-stop")
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), tmp_path, run_id="demo").run_dir
    out = subprocess.run([sys.executable, "-m", "vapo_engine.trainer", str(run_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert "eval/critic_ev" not in evals[0]  # before value pretraining
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("eval   step")]
    for rec, line in zip(evals[1:], lines[1:]):  # one problem per step count: short and mid right, long wrong
        assert "eval/critic_ev" in rec and f"critic held-out ev {rec['eval/critic_ev']:+.2f}" in line
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
