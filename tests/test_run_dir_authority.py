"""A run directory is data, never authority (docs/security.md "A run directory is data, never authority"), each reproduction against real processes and
loopback servers: a run.json that names another settings.json cannot send the key to another base URL; a pid
planted in state.json (or a lock file that is a link to another program's lock) is never signalled; a
rebuilt registry never lets a record claim another run's id; one malformed record costs only its own run;
resume_run twice returns the same attempt and stop_run cancels it; the queue is bounded with a clear error."""
from __future__ import annotations

import fcntl
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, write_workspace
from tests.fake_openai import FakeOpenAI, key_traces
from tests.mcp_helpers import slot_held
from tests.run_helpers import wait_for
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs import Registry, RunError, RunManager, State
from vapo_engine.jobs.registry import DB_NAME
from vapo_engine.jobs.threads import SETTINGS_ENV
from vapo_engine.rundir import RunDir
from vapo_engine.runs import create_run

KEY_ENV, KEY = "VAPO_TEST_AUTHORITY_KEY", "sk-authority-9Qx7Lm2Pz8Rt4Vw6Yb3Nc"
CHAT = "POST /v1/chat/completions"


def _settings(path, base_url: str) -> None:
    s = json.loads((ROOT / "settings.json").read_text())
    s["api"] = {"base_url": base_url, "api_key_env": KEY_ENV, "default_headers": {}}
    s["runtime"]["log_dir"] = str(path.parent / "logs")
    path.write_text(json.dumps(s))


def _finished(root, run_id: str, state=State.SUCCEEDED, experiment: str = "exp", **fields):
    """A run with a registry record in `state` (no training)."""
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    settings = settings.model_copy(update={"experiment": settings.experiment.model_copy(update={"name": experiment})})
    reg = Registry(root)  # before the run directory exists (else it is indexed from disk)
    run_dir = create_run(cfg, settings, root, run_id=run_id, **fields).run_dir
    reg.add(run_id, experiment, ["t"], run_dir)
    reg.claim_queued(1)
    reg.transition(run_id, state, f"{state.value} for the test")
    return run_dir


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def _start_time(pid: int) -> float:
    return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


HOLD_LOCK = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
             "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)")


# --- the key goes where the server's settings say ------------------------------------------------------------
def test_the_key_never_follows_a_settings_path_planted_in_run_json(tmp_path, monkeypatch):
    from vapo_engine.builtin_model import build_tokenizer
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer.provider_samples import provider_samples
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI(key=KEY) as ours, FakeOpenAI() as receiver:
        (tmp_path / "ws").mkdir()
        (tmp_path / "elsewhere").mkdir()
        _, settings = write_workspace(tmp_path / "ws")
        _settings(settings, ours.base_url)
        planted = tmp_path / "elsewhere" / "settings.json"
        _settings(planted, receiver.base_url)
        cfg = load_config(ROOT / "config.toml", ["provider_rollouts.enabled=true",
                                                 "provider_rollouts.samples_per_prompt=1"], preset="cpu-demo")
        run_dir = create_run(cfg, load_settings(settings), tmp_path / "runs", run_id="r",
                             extra={"settings_path": str(planted)}).run_dir  # what an attacker writes
        monkeypatch.setenv(SETTINGS_ENV, str(settings))  # what the run manager gives the worker
        task = get_task("builtin:addition", ROOT)
        sampler = provider_samples(cfg, run_dir, build_tokenizer(), task, is_main=True, log=lambda *a: None)
        sampler.submit(task.train_batch(2, random.Random(0)))
        wait_for(lambda: ours.count(CHAT) + receiver.count(CHAT) >= 2, timeout=60, what="the provider requests")
        sampler.close()
    assert receiver.requests == [], "the key went to the base URL a run directory named"
    assert ours.count(CHAT) >= 2 and ours.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert not any(key_traces(f.read_text(errors="replace"), KEY) for f in run_dir.rglob("*") if f.is_file())


def test_the_supervisor_is_given_the_servers_settings(tmp_path):
    _, settings = write_workspace(tmp_path)
    mgr = RunManager(tmp_path / "runs", settings_path=settings)
    run_dir = create_run(load_config(ROOT / "config.toml"), load_settings(settings), mgr.root, run_id="r").run_dir
    rec = mgr.submit("r", "exp", [], run_dir)
    try:
        environ = Path(f"/proc/{rec.pid}/environ").read_bytes().split(b"\0")
        assert f"{SETTINGS_ENV}={settings.resolve()}".encode() in environ
    finally:
        mgr.stop("r", force=True)


# --- signals only to the processes holding the run's locks ---------------------------------------------------
def test_a_pid_planted_in_state_json_of_a_finished_run_is_never_signalled(tmp_path):
    run_dir = _finished(tmp_path, "r")
    victim = _sleeper()
    try:
        RunDir(run_dir).record_attempt("r", {"worker_pid": victim.pid, "worker_pgid": victim.pid,
                                             "worker_start": _start_time(victim.pid)})
        with pytest.raises(RunError, match="nothing to stop"):
            RunManager(tmp_path).stop("r", force=True)
        time.sleep(0.3)
        assert victim.poll() is None, "a process named only by state.json was killed"
    finally:
        victim.kill()


def test_a_supervisor_planted_before_a_registry_rebuild_is_never_signalled(tmp_path):
    run_dir = _finished(tmp_path, "r")
    victim = _sleeper()
    try:
        RunDir(run_dir).record_attempt("r", {"state": "running", "pid": victim.pid,
                                             "supervisor_start": _start_time(victim.pid)})
        for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        mgr = RunManager(tmp_path)
        assert mgr.get("r").state is State.RUNNING and mgr.get("r").pid == victim.pid
        mgr.stop("r", force=True)
        time.sleep(0.3)
        assert victim.poll() is None, "a process named only by state.json was killed"
    finally:
        victim.kill()


def test_a_lock_file_linked_to_another_programs_lock_is_not_evidence(tmp_path):
    run_dir = _finished(tmp_path, "r", state=State.STOPPED)
    other = tmp_path / "daemon.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(other)], start_new_session=True,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        os.link(other, run_dir / "worker.lock")
        RunDir(run_dir).write_json("worker.json", {"pid": holder.pid, "pgid": holder.pid})
        try:
            RunManager(tmp_path).stop("r", force=True)
        except RunError:
            pass
        time.sleep(0.3)
        assert holder.poll() is None, "the holder of a linked lock file was killed"
    finally:
        holder.kill()
        holder.wait(timeout=10)
    fd = os.open(other, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: the holder is gone
    os.close(fd)


# --- the rebuilt registry --------------------------------------------------------------------------------------
def _drop_registry(root) -> None:
    for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
        (root / name).unlink(missing_ok=True)


def test_a_rebuilt_registry_never_lets_a_record_claim_another_runs_id(tmp_path):
    from tools.paths import Files
    from tools.training import list_runs, run_status
    (tmp_path / "ws").mkdir()
    files = Files(*write_workspace(tmp_path / "ws"))
    root = tmp_path / "ws" / "logs"
    real = _finished(root, "a", experiment="exp")
    planted = _finished(root, "z", experiment="aaa")  # its directory sorts first
    RunDir(planted).record_attempt("a", {"state": "failed", "message": "planted", "experiment": "aaa"})
    _drop_registry(root)
    st = run_status(files, "a")
    assert st.run.run_dir == str(real) and st.run.message != "planted"
    skipped = list_runs(files).skipped
    assert any("claims run id 'a'" in s and str(planted) in s for s in skipped), skipped
    assert {r.run_id for r in list_runs(files).runs} == {"a", "z"}


def test_one_malformed_record_is_skipped_and_every_other_run_kept(tmp_path, monkeypatch):
    import anyio
    from mcp import Client

    from tests.mcp_helpers import text
    ws = tmp_path / "ws"
    ws.mkdir()
    write_workspace(ws)
    root = ws / "logs"
    good = _finished(root, "good")
    bad_meta = _finished(root, "badmeta")
    bad_attempt = _finished(root, "badattempt")
    (bad_meta / "state.json").unlink()  # a run from before state.json: its record comes from run.json
    meta = json.loads((bad_meta / "run.json").read_text())
    (bad_meta / "run.json").write_text(json.dumps({**meta, "created": "notanumber"}))
    RunDir(bad_attempt).record_attempt("badattempt", {"nprocs": "many"})
    _drop_registry(root)

    async def calls():
        from server.app import build_server
        async with Client(build_server()) as c:
            return await c.call_tool("list_runs", {}), await c.call_tool("run_status", {"run_id": "badmeta"})
    monkeypatch.setenv("VAPO_MCP_SETTINGS", str(ws / "settings.json"))
    monkeypatch.setenv("VAPO_MCP_CONFIG", str(ws / "config.toml"))
    listed, status = anyio.run(calls)
    assert not listed.is_error, text(listed)
    data = listed.structured_content
    assert [r["run_id"] for r in data["runs"]] == ["good"] and str(good) in data["runs"][0]["run_dir"]
    reasons = "\n".join(data["skipped"])
    assert "created is \"notanumber\", not a number" in reasons and "nprocs is \"many\", not an integer" in reasons
    assert "delete runs.sqlite3" in reasons
    assert status.is_error and "skipped when the registry was rebuilt" in text(status), text(status)


def test_a_registry_of_another_schema_is_moved_aside_and_rebuilt(tmp_path):
    _finished(tmp_path, "a")
    _drop_registry(tmp_path)
    with sqlite3.connect(tmp_path / DB_NAME) as c:
        c.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT)")
        c.execute("INSERT INTO runs VALUES ('ghost', 'running')")
    mgr = RunManager(tmp_path)
    assert [r.run_id for r in mgr.registry.list()] == ["a"]
    assert len(list(tmp_path.glob(DB_NAME + ".wrong-schema-*"))) == 1


# --- resume twice, stop, the queue bound -----------------------------------------------------------------------
def test_resume_twice_returns_the_same_attempt_and_stop_cancels_it(runs_env, model_dir, monkeypatch):
    from tests.serving_helpers import run_with_checkpoint
    from tools.training import resume_run, stop_run
    files, mgr = runs_env
    monkeypatch.setenv("VAPO_MCP_MAX_CONCURRENT", "1")
    run_with_checkpoint(files, mgr, model_dir, run_id="r")
    mgr.registry.claim_queued(1)
    mgr.registry.transition("r", State.STOPPED, "stopped on request")
    with slot_held(mgr.root):
        first = resume_run(files, "r")
        time.sleep(0.3)
        second = resume_run(files, "r")
        assert first.run_id == second.run_id == "r-r1" and second.state == "queued"
        assert resume_run(files, "r-r1").run_id == "r-r1"
        stopped = stop_run(files, "r")  # r itself is stopped: its queued attempt is what stop cancels
        assert stopped.run_id == "r-r1" and stopped.state == "stopped" and "cancelled" in stopped.message
        assert [r.run_id for r in mgr.registry.list(state="queued")] == []


def test_the_queue_is_bounded_with_a_clear_error(tmp_path, monkeypatch):
    from tools.paths import Files
    from tools.training import ablate, start_training
    files = Files(*write_workspace(tmp_path))
    s = json.loads(files.settings.read_text())
    s["runtime"]["max_queued_runs"] = 2
    files.settings.write_text(json.dumps(s))
    monkeypatch.setenv("VAPO_MCP_MAX_CONCURRENT", "1")
    with slot_held(tmp_path / "logs"):
        for _ in range(2):
            assert start_training(files, preset="cpu-demo").run.state == "queued"
        before = sorted(p.name for p in (tmp_path / "logs").glob("*/*"))
        with pytest.raises(Exception) as full:
            start_training(files, preset="cpu-demo")
        assert "runtime.max_queued_runs is 2" in str(full.value) and "stop_run" in str(full.value)
        with pytest.raises(Exception, match="max_queued_runs"):
            ablate(files, variants=["vapo", "grpo"], preset="cpu-demo")
        assert sorted(p.name for p in (tmp_path / "logs").glob("*/*")) == before, "no run directory was made"


# --- run views read the end of metrics.jsonl, not the whole file -----------------------------------------------
def test_latest_records_read_from_the_end_match_a_full_parse(tmp_path):
    from vapo_engine import metrics
    path = tmp_path / "metrics.jsonl"
    lines = []
    for step in range(1, 3001):
        lines.append(json.dumps({"kind": "train", "step": step, "actor/pg_loss": step / 10}))
        if step % 250 == 0:
            lines.append(json.dumps({"kind": "eval", "step": step, "eval/greedy_accuracy": step / 3000}))
    lines += ['{"kind": "train", "step": "3001"}', '{"note": "kind \\"train\\" mentioned in a string"}',
              "[" * 5000, '{"kind": "train", "st']  # a wrong-typed step, a decoy, deep nesting, a torn line
    path.write_text("\n".join(lines))
    got = metrics.latest(path)
    recs = [r for r in metrics.read_metrics(path) if isinstance(r.get("step"), int)]
    assert got["train"] == [r for r in recs if r.get("kind") == "train"][-1] and got["train"]["step"] == 3000
    assert got["eval"] == [r for r in recs if r.get("kind") == "eval"][-1]
    with path.open("a") as f:
        f.write('\n{"kind": "train", "step": 3001}\n')
    assert metrics.latest(path)["train"]["step"] == 3001  # the cache follows the file
    assert metrics.latest(tmp_path / "missing.jsonl") == {}
