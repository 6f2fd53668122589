"""Stopping and resuming under awkward timing: a force stop before the worker took its lock, a run marked
terminal whose worker still writes, a supervisor pid reused by another process, concurrent resumes."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.conftest import ROOT
from tests.run_helpers import start, wait_for
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs import RunManager, State, outcome
from vapo_engine.rundir import RunDir
from vapo_engine.runs import create_run


def test_force_stop_before_the_worker_holds_its_lock_kills_the_worker(runs_env, model_dir):
    files, mgr = runs_env
    rid = start(files, model_dir, "training.total_steps=5000")
    rd = RunDir(mgr.get(rid).run_dir)
    wait_for(lambda: rd.attempts().get(rid, {}).get("worker_pid"), what="the supervisor to start the worker")
    worker = rd.attempts()[rid]["worker_pid"]
    assert rd.writer() is None  # still importing torch: no lock, no worker.json yet
    rec = mgr.stop(rid, force=True)
    assert rec.state is State.STOPPED
    wait_for(lambda: not outcome.pid_alive(worker), timeout=10, what="the worker to die")
    time.sleep(1.0)
    assert rd.writer() is None and not rd.file("summary.json").exists()


def test_stop_reaches_a_stray_worker_of_a_run_marked_terminal(runs_env, model_dir):
    files, mgr = runs_env
    rid = start(files, model_dir, "training.total_steps=5000")
    rd = RunDir(mgr.get(rid).run_dir)
    wait_for(lambda: rd.writer() is not None, what="the worker's lock")
    sup = mgr.get(rid).pid
    os.kill(sup, signal.SIGKILL)
    wait_for(lambda: not outcome.pid_alive(sup), what="the supervisor to die")
    assert mgr.registry.transition(rid, State.FAILED, "a state that lies")  # e.g. an old server's verdict
    worker = rd.writer()["pid"]
    rec = mgr.stop(rid, force=True)
    assert "stray worker was then force-stopped" in rec.message
    wait_for(lambda: rd.writer() is None, timeout=15, what="the stray worker to die")
    assert not outcome.pid_alive(worker)


def _start_time(pid: int) -> float:
    return float(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])


def test_a_reused_supervisor_pid_is_never_signalled(tmp_path):
    """The registry and state.json say a bystander is the run's supervisor and worker — its pid, process group
    and real start time, everything the former checks compared — but it holds none of the run's locks."""
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    mgr = RunManager(tmp_path)  # before the run directory exists (else it is indexed from disk)
    run_dir = create_run(cfg, settings, tmp_path, run_id="r").run_dir
    mgr.registry.add("r", "exp", [], run_dir)
    mgr.registry.claim_queued(1)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = _start_time(bystander.pid)
        mgr.registry.update("r", pid=bystander.pid, heartbeat=time.time())
        RunDir(run_dir).record_attempt("r", {"supervisor_start": start, "worker_pid": bystander.pid,
                                             "worker_pgid": bystander.pid, "worker_start": start})
        assert mgr.stop("r").state is State.RUNNING  # not our supervisor: nothing is signalled
        assert bystander.poll() is None
        mgr.stop("r", force=True)
        time.sleep(0.2)
        assert bystander.poll() is None  # not even by a force stop
        assert mgr.get("r").state is State.STOPPED
    finally:
        bystander.kill()


def test_concurrent_resumes_get_the_same_attempt(tmp_path):
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    a, b = RunManager(tmp_path), RunManager(tmp_path)
    run_dir = create_run(cfg, settings, tmp_path, run_id="r").run_dir
    a.registry.add("r", "exp", [], run_dir)
    a.registry.claim_queued(1)
    a.registry.transition("r", State.FAILED, "x")
    rec = a.get("r")
    assert a._add_attempt(rec).run_id == b._add_attempt(rec).run_id == "r-r1"  # the second gets the first's
    a.registry.transition("r-r1", State.FAILED, "x")
    a.registry.add("r-r3", "exp", [], run_dir)  # taken by a concurrent resume after our count, and ended
    a.registry.transition("r-r3", State.STOPPED, "x")
    assert a._add_attempt(rec).run_id == "r-r4"  # it counts 2 attempts → r-r3, which is taken → r-r4
