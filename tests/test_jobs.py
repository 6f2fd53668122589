"""Run manager: state machine, multi-process-safe registry, detached workers, kill detection, resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import write_workspace
from tests.engine_helpers import FAST
from vapo_engine.jobs import Registry, RunError, State
from vapo_engine.jobs.states import InvalidTransition, check_transition


def test_state_machine_terminal_states_are_final():
    check_transition(State.QUEUED, State.RUNNING)
    check_transition(State.RUNNING, State.SUCCEEDED)
    for terminal in (State.SUCCEEDED, State.FAILED, State.STOPPED):
        for new in State:
            with pytest.raises(InvalidTransition):
                check_transition(terminal, new)


def test_registry_conditional_transitions(tmp_path):
    reg = Registry(tmp_path)
    reg.add("r1", "exp", ["a"], tmp_path / "r1")
    assert not reg.transition("r1", State.SUCCEEDED)  # queued → succeeded is not allowed
    assert reg.claim_queued(1)[0].run_id == "r1"
    assert reg.transition("r1", State.FAILED, "boom")
    assert not reg.transition("r1", State.SUCCEEDED)  # terminal stays terminal
    assert reg.get("r1").state is State.FAILED and reg.get("r1").message == "boom"
    assert [r.run_id for r in reg.list(tag="a")] == ["r1"] and reg.list(tag="b") == []


def test_registry_claims_are_exclusive_across_processes(tmp_path):
    reg = Registry(tmp_path)
    for i in range(6):
        reg.add(f"r{i}", "exp", [], tmp_path)
    code = ("import sys, json; from vapo_engine.jobs import Registry\n"
            f"print(json.dumps([r.run_id for r in Registry({str(tmp_path)!r}).claim_queued(2)]))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    claimed = [rid for p in procs for rid in json.loads(p.communicate(timeout=60)[0])]
    assert len(claimed) == 2 and len(set(claimed)) == 2  # 2 slots in total, never double-claimed


@pytest.fixture
def files(tmp_path, model_dir):
    """config.toml + settings.json in a temp folder whose runs go to tmp_path/logs."""
    from tools.paths import Files
    return Files(*write_workspace(tmp_path))


def _over(model_dir, *extra):
    return [*FAST, f'model.local_path="{model_dir}"', *extra]


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def test_start_poll_report_then_kill_and_resume(files, model_dir, capsys):
    from server.cli import main
    from tools.report import report_metrics
    from tools.training import list_runs, resume_run, run_status, start_training
    from vapo_engine.config import load_settings
    from vapo_engine.jobs import RunManager
    from vapo_engine.runs import runs_root
    mgr = RunManager(runs_root(load_settings(files.settings), files.settings))
    started = start_training(files, preset="cpu-demo", overrides=_over(model_dir), tags=["t1"])
    run_id = started.run.run_id
    # called outside an MCP tool call (the CLI's caller), so the poll hint is the vapo-mcp command (tools.hints)
    assert started.run.state in ("queued", "running") and f"vapo-mcp runs status {started.run.run_id}" in started.poll
    done = mgr.wait(run_id, timeout=240)
    assert done.state is State.SUCCEEDED, run_status(files, run_id).log_tail
    st = run_status(files, run_id)
    assert st.run.step == 3 and st.run.total_steps == 3 and "eval/greedy_accuracy" in st.run.latest_eval
    rep = report_metrics(files, run_id, cursor=0, limit=2)
    assert rep.next_cursor == 2 and len(rep.series["rollout/reward_mean"]) == 2 and rep.plot_png
    with open(rep.plot_png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert report_metrics(files, run_id, cursor=2, limit=2).next_cursor is None
    assert [r.run_id for r in list_runs(files, tag="t1").runs] == [run_id]
    cli = ["--config", str(files.config), "--settings", str(files.settings)]
    assert main(["runs", "list", *cli]) == 0 and run_id in capsys.readouterr().out
    assert main(["runs", "status", run_id, *cli]) == 0 and "succeeded" in capsys.readouterr().out
    assert main(["report", run_id, *cli]) == 0 and "plot:" in capsys.readouterr().out
    assert main(["runs", "stop", "nope", *cli]) == 2 and "unknown run id" in capsys.readouterr().err

    # a longer run: kill its trainer process mid-way → failed with a resume path → resume finishes it (12 steps:
    # 10 still to go when step 2's checkpoint appears; evaluation only at the start and the end)
    long = start_training(files, preset="cpu-demo", overrides=_over(model_dir, "training.total_steps=12",
                                                                     "eval.save_interval=2", "eval.eval_interval=1000"))
    rid = long.run.run_id
    run_dir = mgr.get(rid).run_dir
    deadline = time.time() + 180
    while time.time() < deadline and not any((p / "DONE").exists() for p in (run_dir / "checkpoints").glob("s*")):
        time.sleep(0.3)
    runner = mgr.get(rid).pid
    for child in _children(runner):
        os.kill(child, signal.SIGKILL)
    rec = mgr.wait(rid, timeout=60)
    assert rec.state is State.FAILED and "killed by signal 9" in rec.message and "resume_run" in rec.message
    resumed = resume_run(files, rid)
    assert resumed.resumed_from == rid and resumed.run_id == f"{rid}-r1"
    fin = mgr.wait(resumed.run_id, timeout=300)
    assert fin.state is State.SUCCEEDED, run_status(files, resumed.run_id).log_tail
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 12
    with pytest.raises(RunError, match="unknown run id"):
        run_status(files, "nope")


def _wait_for_step(run_dir, step: int, timeout: float = 180) -> None:
    from vapo_engine.metrics import read_metrics
    end = time.time() + timeout
    while time.time() < end:
        if any(r.get("kind") == "train" and r["step"] >= step for r in read_metrics(run_dir / "metrics.jsonl")):
            return
        time.sleep(0.3)
    raise AssertionError("no training progress")


def test_graceful_stop_and_dead_supervisor_recovery(files, model_dir):
    from tools.training import start_training, stop_run
    from vapo_engine.config import load_settings
    from vapo_engine.jobs import RunManager
    from vapo_engine.runs import runs_root
    mgr = RunManager(runs_root(load_settings(files.settings), files.settings))
    rid = start_training(files, preset="cpu-demo", overrides=_over(model_dir, "training.total_steps=400")).run.run_id
    _wait_for_step(mgr.get(rid).run_dir, 1)
    assert stop_run(files, rid).state == "running"  # asked; the worker checkpoints, then exits
    rec = mgr.wait(rid, timeout=120)
    assert rec.state is State.STOPPED and "resume_run" in rec.message
    assert any((p / "DONE").exists() for p in (rec.run_dir / "checkpoints").glob("step-*"))

    rid = start_training(files, preset="cpu-demo", overrides=_over(model_dir, "training.total_steps=400")).run.run_id
    _wait_for_step(mgr.get(rid).run_dir, 1)
    from vapo_engine.rundir import RunDir
    worker_group = RunDir(mgr.get(rid).run_dir).writer()["pgid"]
    os.killpg(mgr.get(rid).pid, signal.SIGKILL)  # supervisor and worker (own sessions) die without a word
    os.killpg(worker_group, signal.SIGKILL)
    deadline = time.time() + 30
    while RunDir(mgr.get(rid).run_dir).writer() is not None and time.time() < deadline:
        time.sleep(0.1)
    assert rid in mgr.recover()
    rec = mgr.get(rid)
    assert rec.state is State.FAILED and "died without reporting" in rec.message
    assert "resume_run" in rec.message or "start_training again" in rec.message
