"""Scale-out on CPU: torchrun --nproc_per_node 2 (gloo) writes metrics once and its checkpoint resumes on one
process; the 2-process step equals the single-process step in tests/test_fsdp.py (one, ddp and fsdp compared)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, write_workspace
from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics

# greedy decoding makes the rollout independent of the per-rank sampling streams, so both worlds see the
# same global batch (the prompt list is drawn from a shared stream and split by rank)
EXACT = ["model.temperature=0", "training.batch_size=8", "vapo.group_size=2", "training.mini_batch_size=8",
         "training.micro_batch_size=2", "vapo.positive_replay=false"]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _torchrun(*args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


@pytest.mark.two_processes
def test_cli_launches_two_processes_metrics_once_and_resume_on_one(tmp_path, model_dir):
    write_workspace(tmp_path)
    cli = [sys.executable, "-m", "server.cli", "train", "--config", str(ROOT / "config.toml"), "--settings",
           str(tmp_path / "settings.json"), "--preset", "cpu-demo", "--json",
           "--set", f'model.local_path="{model_dir}"', "--set", "distributed.nproc_per_node=2"]
    fast = ["training.total_steps=2", "training.batch_size=8", "vapo.group_size=2", "model.max_tokens=8",
            "vapo.value_pretrain_steps=1", "eval.num_problems=4", "eval.samples_per_problem=1",
            "training.mini_batch_size=8", "eval.save_interval=2", "eval.eval_interval=100"]
    r = subprocess.run(check=False, args=cli + [x for o in fast for x in ("--set", o)], env=_env(), cwd=tmp_path,
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
    from vapo_engine.trainer.loop import train
    said = []
    assert train(run_dir, resume=True, log=said.append)["status"] == "succeeded"  # one process: this one
    assert "resumed from step-0000002 (policy step 2)" in said
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
