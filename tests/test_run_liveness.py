"""Run state that never lies (docs/design.md §5.5): the worker, not only its supervisor, decides whether a run
is alive; a run whose supervisor died still finishes or stops on request; never two writers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.run_helpers import start, wait_for
from vapo_engine.jobs import RunError, RunManager, State, outcome
from vapo_engine.metrics import read_metrics
from vapo_engine.rundir import RunDir


def _train_steps(run_dir) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "train"]


def _kill_supervisor_only(mgr: RunManager, run_id: str) -> int:
    rec = mgr.get(run_id)
    wait_for(lambda: RunDir(rec.run_dir).writer() is not None, what="the worker's writer lock")
    wait_for(lambda: _train_steps(rec.run_dir), what="a first training step")
    os.kill(rec.pid, signal.SIGKILL)
    wait_for(lambda: not outcome.pid_alive(rec.pid), what="the supervisor to die")
    return RunDir(rec.run_dir).writer()["pid"]


def test_worker_outlives_its_supervisor_and_still_finishes(runs_env, model_dir):
    files, mgr = runs_env
    rid = start(files, model_dir, "training.total_steps=16")  # 15 steps still to go when its supervisor dies
    worker = _kill_supervisor_only(mgr, rid)
    mgr.tick()
    rec = mgr.get(rid)
    assert rec.state is State.RUNNING, rec.message  # the old recovery said "failed — worker died" here
    assert f"worker (pid {worker}) is still training" in rec.message
    with pytest.raises(RunError, match="only failed or stopped runs can be resumed"):
        mgr.resume(rid)
    wait_for(lambda: mgr.wait(rid, timeout=1, poll=0.2).state.terminal, timeout=300, what="the run to end")
    rec = mgr.get(rid)
    assert rec.state is State.SUCCEEDED and "finished 16 steps" in rec.message, rec.message
    assert _train_steps(rec.run_dir) == list(range(1, 17))  # one writer: never backwards, never twice


def test_stop_reaches_a_worker_whose_supervisor_died_and_no_second_writer_starts(runs_env, model_dir):
    files, mgr = runs_env
    rid = start(files, model_dir, "training.total_steps=5000")
    worker = _kill_supervisor_only(mgr, rid)
    run_dir = mgr.get(rid).run_dir
    # a second trainer on the same directory refuses to start while the lock is held
    r = subprocess.run(check=False, args=[sys.executable, "-m", "vapo_engine.trainer", str(run_dir), "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"another worker (pid {worker}) is writing run directory" in r.stderr
    view = mgr.stop(rid)
    assert view.state is State.RUNNING and f"stop requested from the worker (pid {worker})" in view.message
    wait_for(lambda: mgr.wait(rid, timeout=1, poll=0.2).state.terminal, timeout=180, what="the stop")
    rec = mgr.get(rid)
    assert rec.state is State.STOPPED and "resume_run continues from the checkpoint at step" in rec.message
    steps = _train_steps(run_dir)
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    with pytest.raises(RunError, match=r"already stopped, so there is nothing to stop; resume_run\('"):
        mgr.stop(rid)


def test_dead_supervisor_and_dead_worker_fail_with_the_resume_path(runs_env, model_dir):
    files, mgr = runs_env
    rid = start(files, model_dir, "training.total_steps=5000")
    worker = _kill_supervisor_only(mgr, rid)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: RunDir(mgr.get(rid).run_dir).writer() is None, what="the lock to be released")
    assert rid in mgr.recover()
    rec = mgr.get(rid)
    assert rec.state is State.FAILED and "died without reporting" in rec.message
    assert "resume_run continues from the checkpoint at step" in rec.message or "start_training" in rec.message
