"""FSDP2 on CPU (gloo, 2 processes): the sharded step equals the DDP and the one-process step, a ddp checkpoint
resumes sharded and a sharded one on one process (exactly: each resumed step equals the uninterrupted run's), and
lock-step generation with ranks that finish at different lengths does not hang."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.engine_helpers import make_run, random_value_dir
from tests.test_distributed import EXACT, _env, _torchrun
from vapo_engine.metrics import read_metrics

pytestmark = pytest.mark.two_processes  # every test here but one starts two ranks

FSDP = ['distributed.strategy="fsdp"']
STEP_METRICS = ("actor/pg_loss", "critic/value_loss", "rollout/reward_mean", "rollout/response_length",
                "vapo/advantage_std", "actor/grad_norm", "critic/grad_norm", "actor/entropy", "actor/pg_clipfrac")


def _run(cmd: list[str], timeout: int = 300) -> str:
    r = subprocess.run(check=False, args=cmd, env=_env(), cwd=ROOT, timeout=timeout, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-2000:]
    return r.stdout


@pytest.fixture(scope="module")
def steps(tmp_path_factory, model_dir) -> dict:
    """One rollout step of the same run as one process (this one) and as ddp and fsdp on 2 ranks, with a value
    model whose non-zero head makes every gradient non-zero. Both 2-rank steps run in one torchrun (tests/
    dist_step.py steps them in turn), whose ranks then also run the lock-step generation check (rank<N>.json in
    the "lock" folder): one launch for three tests' worth of 2-process work."""
    from tests.dist_step import step
    folder = tmp_path_factory.mktemp("fsdp-steps")
    value = f'model.value_path="{random_value_dir(folder, model_dir)}"'
    runs = {name: make_run(folder, model_dir, EXACT + extra + [value], name)
            for name, extra in (("one", []), ("ddp", []), ("fsdp", FSDP))}
    (lock := folder / "lock").mkdir()
    _run(_torchrun(str(ROOT / "tests/dist_step.py"), str(runs["ddp"]), str(folder / "ddp.pt"), str(runs["fsdp"]),
                   str(folder / "fsdp.pt"), "--lock-step", str(model_dir), str(lock)))
    return {"one": step(runs["one"])[1], "lock": lock, **{s: torch.load(folder / f"{s}.pt") for s in ("ddp", "fsdp")}}


def test_fsdp_step_equals_ddp_and_one_process(steps):
    one, ddp, fsdp = steps["one"], steps["ddp"], steps["fsdp"]
    for r in (one, ddp, fsdp):
        assert r["grads"].abs().max() > 1e-4 and r["vgrads"].abs().max() > 1e-4
    for a, b in ((fsdp, one), (fsdp, ddp), (ddp, one)):  # ddp vs one: the data-parallel step of test_distributed
        assert torch.allclose(a["grads"], b["grads"], rtol=1e-4, atol=1e-7)
        assert torch.allclose(a["vgrads"], b["vgrads"], rtol=1e-4, atol=1e-7)
        for k in STEP_METRICS + ("actor/positive_nll", "vapo/lambda_policy_mean"):
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-4, abs=1e-6), k
        if "critic/explained_var" in b["metrics"]:
            assert a["metrics"]["critic/explained_var"] == pytest.approx(b["metrics"]["critic/explained_var"],
                                                                         rel=1e-4, abs=1e-6)


def _train(run, procs: int, resume: bool = False) -> str:
    args = ["-m", "vapo_engine.trainer", str(run), *(["--resume"] if resume else [])]
    return _run(_torchrun(*args) if procs == 2 else [sys.executable, *args])


def _set_steps(run, steps: int, **distributed) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["training"]["total_steps"] = steps
    cfg["distributed"].update(distributed)
    (run / "config.json").write_text(json.dumps(cfg))


def _train_records(run, step: int) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train" and r["step"] == step]


def test_checkpoints_resume_across_strategies_and_world_sizes_exactly(tmp_path, model_dir):
    """ddp (2 ranks) → fsdp (2 ranks) → one plain process, in one run directory: an uninterrupted 4-step ddp run,
    its step-2 checkpoint resumed sharded for step 3 (which writes a sharded step-3 checkpoint), that one resumed
    on one process for step 4. Each resumed step equals the uninterrupted run's (a ddp step equals the fsdp and
    the one-process step, see above); the uninterrupted records stay first, the resumed ones follow."""
    value = f'model.value_path="{random_value_dir(tmp_path, model_dir)}"'
    run = make_run(tmp_path, model_dir, EXACT + ["training.total_steps=4", value], "chain")  # saves at 2 and 4
    _train(run, 2)
    for step in (3, 4):
        (a,) = _train_records(run, step)
        assert a["actor/grad_norm"] > 1e-4 and a["critic/grad_norm"] > 1e-4  # a real update, not zeros
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    _set_steps(run, 3, strategy="fsdp")
    assert "resumed from step-0000002" in _train(run, 2, resume=True)
    ckpt = run / "checkpoints" / "step-0000003"  # the end of the sharded run
    assert (ckpt / "sharded" / ".metadata").is_file() and (ckpt / "policy" / "model.safetensors").is_file()
    from transformers import AutoModelForCausalLM
    cfg = json.loads((ckpt / "policy" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]  # a plain HF export, not the FSDP wrapper class
    AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    _set_steps(run, 4, nproc_per_node=1)
    assert "resumed from step-0000003" in _train(run, 1, resume=True)
    for step in (3, 4):
        recs = _train_records(run, step)
        assert len(recs) == 2  # the uninterrupted step, then the resumed one
        for k in STEP_METRICS:
            assert recs[0][k] == pytest.approx(recs[1][k], rel=1e-4, abs=1e-6), (step, k)


def test_lock_step_generation_with_ranks_ending_at_different_lengths(steps):
    ranks = {r: json.loads((steps["lock"] / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert ranks[0]["lock_step"] and ranks[1]["lock_step"]
    assert ranks[0]["lengths"] == [1, 1]  # rank 0 finished after its first token …
    assert max(ranks[1]["lengths"]) > 1   # … while rank 1 kept decoding; neither hung


def test_cli_fsdp_run_with_sampling_and_replay_finishes(tmp_path, model_dir):
    """The whole recipe sharded through the CLI (the loopback launcher): sampled rollouts whose lengths differ
    by rank, positive replay on only some ranks, value pretraining, evaluation in slices, a sharded checkpoint."""
    from tests.conftest import write_workspace
    write_workspace(tmp_path)
    cli = [sys.executable, "-m", "server.cli", "train", "--config", str(ROOT / "config.toml"), "--settings",
           str(tmp_path / "settings.json"), "--preset", "cpu-demo", "--json",
           "--set", f'model.local_path="{model_dir}"', "--set", "distributed.nproc_per_node=2",
           "--set", 'distributed.strategy="fsdp"']
    fast = ["training.total_steps=3", "training.batch_size=8", "vapo.group_size=2", "model.max_tokens=12",
            "vapo.value_pretrain_steps=1", "eval.num_problems=5", "eval.samples_per_problem=2",
            "training.mini_batch_size=4", "eval.save_interval=3", "eval.eval_interval=2", "training.kl_coef=0.01"]
    r = subprocess.run(check=False, args=cli + [x for o in fast for x in ("--set", o)], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
    run_dir = next((tmp_path / "logs").glob("*/*/"))
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert [x["step"] for x in recs if x["kind"] == "train"] == [2, 3]  # two updates per rollout, capped at 3
    evals = [x for x in recs if x["kind"] == "eval"]
    assert [x["step"] for x in evals] == [0, 2, 3] and all("eval/greedy_accuracy" in x for x in evals)
    assert (run_dir / "checkpoints" / "step-0000003" / "sharded" / ".metadata").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"


def test_planted_pickle_in_sharded_metadata_is_never_executed(tmp_path, model_dir):
    """DCP's own reader would `pickle.load` the shards' .metadata; ours admits only DCP's metadata classes, so a
    planted pickle (with the manifest re-signed, as an attacker with write access would) is refused, never run."""
    import os

    from tests.test_checkpoint_integrity import _Planted
    from vapo_engine.rundir import RunDir, write_manifest
    from vapo_engine.trainer.setup import build_trainer
    from vapo_engine.trainer.sharded_checkpoint import save_sharded
    run = make_run(tmp_path, model_dir, FSDP, "planted")
    tr = build_trainer(run, write=False, log=lambda m: None)  # one process: plain models, DCP without a group
    ckpt = save_sharded(run, 2, tr.models, tr.opt_actor, tr.opt_critic, tr.state_dict(), tr.world)
    marker = tmp_path / "pwned"
    with open(ckpt / "sharded" / ".metadata", "wb") as f:
        import pickle
        pickle.dump(_Planted(marker), f)
    write_manifest(ckpt, 2)
    r = subprocess.run(check=False, args=[sys.executable, "-m", "vapo_engine.trainer", str(run), "--resume"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert not marker.exists(), "unpickling the planted DCP metadata ran code"
    assert r.returncode == 2 and "step-0000002 (cannot be loaded: ShardedLoadError" in r.stderr, r.stderr[-2000:]
    assert "posix.system is not allowed in checkpoint metadata" in r.stderr
    assert "Traceback" not in r.stderr
    assert RunDir(run).checkpoint(2).is_dir()


def test_cpu_offload_on_cpu_is_refused_with_the_fix(tmp_path, model_dir):
    run = make_run(tmp_path, model_dir, EXACT + FSDP + ["distributed.cpu_offload=true"], "offload")
    r = subprocess.run(check=False, args=_torchrun("-m", "vapo_engine.trainer", str(run)), env=_env(), cwd=ROOT, timeout=300,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "distributed.cpu_offload = true needs CUDA" in r.stderr and "set distributed.cpu_offload = false" in r.stderr
