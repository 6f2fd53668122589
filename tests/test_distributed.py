"""Scale-out on CPU: torchrun --nproc_per_node 2 (gloo) gives the single-process step, writes metrics once,
and its checkpoint resumes on one process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, write_workspace
from tests.engine_helpers import make_run, random_value_dir
from vapo_engine.metrics import read_metrics

# greedy decoding makes the rollout independent of the per-rank sampling streams, so both worlds see the
# same global batch (the prompt list is drawn from a shared stream and split by rank)
EXACT = ["model.temperature=0", "training.batch_size=8", "vapo.group_size=2", "training.mini_batch_size=8",
         "training.micro_batch_size=2", "vapo.positive_replay=false"]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _torchrun(*args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def test_two_processes_equal_one_process_step(tmp_path, model_dir):
    value = [f'model.value_path="{random_value_dir(tmp_path, model_dir)}"']  # non-zero gradients to compare
    one, two = make_run(tmp_path, model_dir, EXACT + value, "one"), make_run(tmp_path, model_dir, EXACT + value, "two")
    subprocess.run([sys.executable, str(ROOT / "tests/dist_step.py"), str(one), str(tmp_path / "one.pt")],
                   check=True, env=_env(), cwd=ROOT, timeout=300, capture_output=True)
    r = subprocess.run(_torchrun(str(ROOT / "tests/dist_step.py"), str(two), str(tmp_path / "two.pt")),
                       env=_env(), cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert a["grads"].abs().max() > 1e-4 and a["vgrads"].abs().max() > 1e-4
    assert torch.allclose(a["grads"], b["grads"], rtol=1e-4, atol=1e-7)
    assert torch.allclose(a["vgrads"], b["vgrads"], rtol=1e-4, atol=1e-7)
    for k in ("actor/pg_loss", "critic/value_loss", "actor/positive_nll", "rollout/reward_mean",
              "rollout/response_length", "vapo/advantage_std", "vapo/lambda_policy_mean", "actor/grad_norm",
              "critic/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
        assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-4, abs=1e-6), k
    if "critic/explained_var" in a["metrics"]:
        assert a["metrics"]["critic/explained_var"] == pytest.approx(b["metrics"]["critic/explained_var"],
                                                                     rel=1e-4, abs=1e-6)


def test_cli_launches_two_processes_metrics_once_and_resume_on_one(tmp_path, model_dir):
    write_workspace(tmp_path)
    cli = [sys.executable, "-m", "server.cli", "train", "--config", str(ROOT / "config.toml"), "--settings",
           str(tmp_path / "settings.json"), "--preset", "cpu-demo", "--json",
           "--set", f'model.local_path="{model_dir}"', "--set", "distributed.nproc_per_node=2"]
    fast = ["training.total_steps=2", "training.batch_size=8", "vapo.group_size=2", "model.max_tokens=8",
            "vapo.value_pretrain_steps=1", "eval.num_problems=4", "eval.samples_per_problem=1",
            "training.mini_batch_size=8", "eval.save_interval=2", "eval.eval_interval=100"]
    r = subprocess.run(cli + [x for o in fast for x in ("--set", o)], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
    run_dir = next((tmp_path / "logs").glob("*/*/"))
    recs = read_metrics(run_dir / "metrics.jsonl")
    steps = [x["step"] for x in recs if x["kind"] == "train"]
    assert steps == [1, 2]  # written once, by rank 0
    assert len([x for x in recs if x["kind"] == "pretrain"]) == 1
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["training"]["total_steps"] = 3
    (run_dir / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "vapo_engine.trainer", str(run_dir), "--resume"], env=_env(),
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step-0000002" in r.stdout
    steps = [x["step"] for x in read_metrics(run_dir / "metrics.jsonl") if x["kind"] == "train"]
    assert steps == [1, 2, 3]


def test_run_manager_launch_command_follows_the_config(tmp_path, model_dir):
    from vapo_engine.jobs.runner import worker_command
    one = make_run(tmp_path, model_dir, [], "single")
    assert worker_command(one, False)[1:3] == ["-m", "vapo_engine.trainer"]
    two = make_run(tmp_path, model_dir, ["distributed.nproc_per_node=2"], "double")
    cmd = worker_command(two, True)  # one node: the loopback-bound launcher, not torchrun's open rendezvous
    assert cmd[1:4] == ["-m", "vapo_engine.trainer.launch", "2"] and cmd[-1] == "--resume"
    multi = make_run(tmp_path, model_dir, ["distributed.nproc_per_node=2", "distributed.nnodes=2",
                                           "distributed.rdzv_endpoint=\"10.0.0.1:29400\""], "multi")
    cmd = worker_command(multi, False)
    assert "--nnodes=2" in cmd and "--rdzv_endpoint=10.0.0.1:29400" in cmd and "--node_rank=0" in cmd
