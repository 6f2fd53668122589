"""Rollouts on inference servers (`rollout.backend = "server"`): two real `serve-model` replicas on 127.0.0.1
(in-thread uvicorn) speaking the rollout protocol. The servers' log-probs are the trainer's; every step's weights
reach them with a version and each rollout carries the version that sampled it; a replica that dies mid-run costs
no step; with every replica down the run waits, says so, and fails with a finding that names the URL."""
from __future__ import annotations

import random
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.engine_helpers import make_run, pushed_remote_policy
from tests.fake_openai import closed_port
from tests.serving_helpers import serving
from vapo_engine.metrics import CATALOGUE, read_metrics
from vapo_engine.rollout.backends.replicas import ReplicasUnavailable
from vapo_engine.rundir import ROLLOUT_JSON, RunDir


@contextmanager
def replicas(model_dir: Path, root: Path, count: int = 2):
    """`count` serve-model replicas of `model_dir` that may load weights from under `root`."""
    with ExitStack() as stack:
        yield [stack.enter_context(serving(model_dir, weight_root=root)) for _ in range(count)]


def server_run(tmp_path: Path, model_dir: Path, urls: list[str], extra: list[str] = ()) -> Path:
    listed = ", ".join(f'"{u}"' for u in urls)
    return make_run(tmp_path, model_dir, ['rollout.backend="server"', f"rollout.urls=[{listed}]",
                                          f'rollout.weights_dir="{tmp_path / "weights"}"', *extra])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_log_probs_equal_the_trainers(tmp_path, model_dir, temperature):
    from vapo_engine.rollout.experience import attach_old_outputs, sample_rollout
    from vapo_engine.tasks import get_task
    with replicas(model_dir, tmp_path) as (a, b):
        models = pushed_remote_policy(model_dir, "server", [a.root, b.root], tmp_path, version=3, seed=0)
        task = get_task("builtin:addition", tmp_path)
        problems = [p for p in task.train_batch(6, random.Random(0)) for _ in range(2)]
        ro = sample_rollout(models, task, problems, max_new_tokens=10, temperature=temperature, top_p=1.0)
        ro = attach_old_outputs(models, ro, 6)
        mask = ro.response_mask.bool()
        assert ro.weight_version == 3 and mask.sum() > len(problems)
        assert (ro.sampler_log_probs - ro.old_log_probs)[mask].abs().max() <= 1e-4
        assert (ro.sampler_log_probs[~mask] == 0).all()
        assert all(s.prepared.rollout.stats["generate"] > 0 for s in (a, b))  # prompts spread over both
        assert httpx.get(a.root + "/health").json()["weight_version"] == 3


def test_weights_reach_the_replicas_every_step_with_their_version(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    with replicas(model_dir, tmp_path) as servers:
        run = server_run(tmp_path, model_dir, [s.root for s in servers])
        lines: list[str] = []
        assert train(run, log=lines.append)["status"] == "succeeded"
        assert not [m for m in lines if "replica" in m]  # nothing failed, nothing to report
        recs = read_metrics(run / "metrics.jsonl")
        assert all(k in CATALOGUE for r in recs for k in r if k not in ("step", "kind", "time"))
        train_recs = [r for r in recs if r["kind"] == "train"]
        # one update per rollout here: the record of step k is rollout step k-1, sampled with version k-1
        assert [r["rollout/weight_version"] for r in train_recs] == [r["step"] - 1 for r in train_recs] == [0, 1, 2]
        assert all(r["rollout/replicas_up"] == 2 and r["rollout/replica_failovers"] == 0 for r in train_recs)
        for s in servers:  # the last push (after step 3) reached every replica, and they sampled
            info = s.prepared.rollout.info()
            assert info["weight_version"] == 3 and s.prepared.rollout.stats["generate"] > 0
            assert s.prepared.rollout.stats["loads"] == 4  # versions 0 (start), 1, 2, 3
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v0000003"]  # older versions deleted
        assert RunDir(run).read_json(ROLLOUT_JSON) == {}


def test_sync_every_pushes_every_k_rollout_steps_and_before_evaluations(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    with replicas(model_dir, tmp_path, count=1) as (s,):
        run = server_run(tmp_path, model_dir, [s.root], ["rollout.sync_every=3", "vapo.value_pretrain_steps=0",
                                                         "eval.eval_interval=2"])
        assert train(run, log=lambda m: None)["status"] == "succeeded"
        recs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
        # pushed at the start, before the evaluation after step 2 (eval_interval 2), after step 3 (sync_every and
        # the end's evaluation): no evaluation sees a stale policy, and rollout 3 is sampled with version 2
        assert [r["rollout/weight_version"] for r in recs] == [0, 0, 2]
        assert s.prepared.rollout.stats["loads"] == 3 and s.prepared.rollout.info()["weight_version"] == 3


def test_a_replica_that_dies_mid_run_costs_no_step(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    with replicas(model_dir, tmp_path) as (a, b):
        run = server_run(tmp_path, model_dir, [a.root, b.root])
        killed = []

        def on_record(rec):
            if rec["kind"] == "train" and not killed:
                b.stop()  # as if its process died after step 1
                killed.append(rec["step"])
        lines: list[str] = []
        summary = train(run, on_record=on_record, log=lines.append)
        assert summary["status"] == "succeeded" and summary["steps"] == 3 and killed == [1]
        assert any(f"rollout replica {b.root} failed" in m and "go to the others" in m for m in lines)
        recs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
        assert [r["step"] for r in recs] == [1, 2, 3]
        assert sum(r["rollout/replica_failovers"] for r in recs) >= 1 and recs[-1]["rollout/replicas_up"] == 1
        assert a.prepared.rollout.info()["weight_version"] == 3


def test_all_replicas_down_waits_says_so_and_fails_with_a_finding(tmp_path, model_dir, runs_env):
    from tools.diagnose import diagnose_error
    from tools.training import run_status
    from vapo_engine.jobs.states import State
    from vapo_engine.trainer.loop import train
    files, manager = runs_env
    url = f"http://127.0.0.1:{closed_port()}"
    run = server_run(tmp_path, model_dir, [url], ["rollout.unavailable_timeout_s=4"])
    manager.registry.add("down-run", "default", [], run)
    manager.registry.transition("down-run", State.RUNNING, "training; poll run_status")
    failure: list[BaseException] = []

    def go():
        try:
            train(run, log=lambda m: None)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            failure.append(e)
    worker = threading.Thread(target=go)
    worker.start()
    seen = None
    while worker.is_alive() and seen is None:
        waiting = (RunDir(run).read_json(ROLLOUT_JSON) or {}).get("waiting")
        seen = run_status(files, "down-run") if waiting else None
        worker.join(0.1)
    worker.join(60)
    assert seen is not None and url in seen.rollout_servers and "waiting" in seen.run.message
    assert isinstance(failure[0], ReplicasUnavailable) and url in str(failure[0])
    assert "rollout.unavailable_timeout_s" in str(failure[0])
    findings = diagnose_error(run_dir=run, env={}, limit=50).findings
    top = next(f for f in findings if f.rule_id == "train-rollout-servers-down")
    assert url in " ".join(top.evidence) and "serve-model" in top.fix and "rollout.urls" in top.fix


def test_a_replica_serving_another_model_is_refused(tmp_path, model_dir):
    from vapo_engine.builtin_model import make_model_dir
    from vapo_engine.rollout.backends.replicas import ReplicaRefused
    from vapo_engine.trainer.loop import train
    other = make_model_dir(tmp_path / "wider", hidden=48, layers=2, heads=2, seed=0)
    with replicas(other, tmp_path, count=1) as (s,):
        run = server_run(tmp_path, model_dir, [s.root])
        with pytest.raises(ReplicaRefused, match=rf"{s.root} serves a different model .*hidden_size"):
            train(run, log=lambda m: None)


def test_preflight_refuses_a_run_whose_replicas_do_not_answer(tmp_path, model_dir):
    from tests.conftest import write_workspace
    from tests.test_doctor import ROOMY
    from vapo_engine.doctor import run_doctor
    config, _ = write_workspace(tmp_path)
    dead = f"http://127.0.0.1:{closed_port()}"
    with replicas(model_dir, tmp_path, count=1) as (s,):
        for urls, ok in (([dead], False), ([dead, s.root], True)):
            listed = ", ".join(f'"{u}"' for u in urls)
            rep = run_doctor(config, overrides=["eval.benchmark=builtin:addition", 'rollout.backend="server"',
                                                f"rollout.urls=[{listed}]"], log_dir=tmp_path / "logs", host=ROOMY)
            net = [f for f in rep.findings if f.check == "network" and "rollout server" in f.what]
            assert [f.severity for f in net] == (["info"] if ok else ["error"]), rep.text()
            assert ok or (dead in net[0].what and "start the rollout server" in net[0].fix)
