"""The run manager: submit, queue, start detached supervisors, stop, resume, recover. Torch-free.

Runs execute as `python -m vapo_engine.jobs.runner` in their own process session (so they outlive the
server); at most `max_concurrent` run at once (default 1: two runs never fight over one device); the rest
wait queued and start when a slot frees (each finishing runner and every manager call tick the queue).
On every tick, a running run whose supervisor is gone (no process, stale heartbeat) is marked failed with
the reason and a resume path.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vapo_engine.errors import UserError

from .registry import Registry, RunRecord
from .runner import HEARTBEAT_S, log_tail
from .states import State

STALE_AFTER_S = max(30.0, 10 * HEARTBEAT_S)
MAX_CONCURRENT_ENV = "VAPO_MCP_MAX_CONCURRENT"


class RunError(UserError):
    """A request the caller can fix (unknown run id, wrong state), with the fix in the message."""


class RunManager:
    def __init__(self, root: str | Path, max_concurrent: int | None = None):
        self.root = Path(root)
        self.registry = Registry(self.root)
        self.max_concurrent = max_concurrent or int(os.environ.get(MAX_CONCURRENT_ENV, "1"))

    def submit(self, run_id: str, experiment: str, tags, run_dir: Path, *, group_id: str | None = None,
               variant: str | None = None, nprocs: int = 1) -> RunRecord:
        self.registry.add(run_id, experiment, tags, run_dir, group_id=group_id, variant=variant, nprocs=nprocs)
        self.tick()
        return self.registry.get(run_id)

    def tick(self) -> list[str]:
        """Recover dead runs, then start queued runs while slots are free. Returns the started run ids."""
        self.recover()
        started = []
        for rec in self.registry.claim_queued(self.max_concurrent):
            self._spawn(rec)
            started.append(rec.run_id)
        return started

    def _spawn(self, rec: RunRecord) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(rec.run_dir / "runner.log", "ab") as out:
            p = subprocess.Popen([sys.executable, "-m", "vapo_engine.jobs.runner", str(self.root), rec.run_id],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=env, close_fds=True)
        self.registry.update(rec.run_id, pid=p.pid, heartbeat=time.time())

    def recover(self) -> list[str]:
        """Mark running runs whose supervisor died as failed (with the evidence and the resume path)."""
        failed = []
        now = time.time()
        for rec in self.registry.list(state=State.RUNNING.value, limit=10_000):
            beat = rec.heartbeat or rec.started or rec.created
            if _alive(rec.pid) and now - beat < STALE_AFTER_S:
                continue
            if now - beat < STALE_AFTER_S:
                continue  # just started, pid may not be recorded yet
            msg = (f"the worker died without reporting (no heartbeat for {now - beat:.0f}s, pid {rec.pid} gone); "
                   f"last log: {log_tail(rec.run_dir / 'worker.log', 2)!r}; resume_run('{rec.run_id}') "
                   "continues from the last checkpoint")
            if self.registry.transition(rec.run_id, State.FAILED, msg):
                failed.append(rec.run_id)
        return failed

    def get(self, run_id: str) -> RunRecord:
        rec = self.registry.get(run_id) if run_id else None
        if rec is None:
            known = ", ".join(r.run_id for r in self.registry.list(limit=5)) or "none yet"
            raise RunError(f"unknown run id {run_id!r}; recent runs: {known} (list_runs shows all)")
        return rec

    def stop(self, run_id: str, *, force: bool = False) -> RunRecord:
        rec = self.get(run_id)
        if rec.state.terminal:
            raise RunError(f"run {run_id} is already {rec.state.value}; nothing to stop")
        if rec.state is State.QUEUED:
            self.registry.transition(run_id, State.STOPPED, "stopped before it started")
        elif rec.pid:
            sig = signal.SIGKILL if force else signal.SIGTERM
            try:
                os.killpg(rec.pid, sig) if force else os.kill(rec.pid, sig)
            except ProcessLookupError:
                pass
            if force:
                self.registry.transition(run_id, State.STOPPED, "force-stopped (SIGKILL); resume_run continues "
                                         "from the last checkpoint")
        return self.get(run_id)

    def resume(self, run_id: str) -> RunRecord:
        rec = self.get(run_id)
        if not rec.state.terminal or rec.state is State.SUCCEEDED:
            raise RunError(f"run {run_id} is {rec.state.value}; only failed or stopped runs can be resumed")
        if not any((p / "DONE").is_file() for p in (rec.run_dir / "checkpoints").glob("step-*")):
            raise RunError(f"run {run_id} has no complete checkpoint to resume from; start_training again")
        base = rec.run_id.split("-r")[0] if "-r" in rec.run_id[-4:] else rec.run_id
        n = 1 + sum(1 for r in self.registry.list(limit=10_000) if r.run_id.startswith(base + "-r"))
        new_id = f"{base}-r{n}"
        self.registry.add(new_id, rec.experiment, rec.tags, rec.run_dir, resumed_from=run_id,
                          group_id=rec.group_id, variant=rec.variant, resume=True, nprocs=rec.nprocs)
        self.tick()
        return self.get(new_id)

    def wait(self, run_id: str, timeout: float, poll: float = 0.5) -> RunRecord:
        """Block until the run is terminal or `timeout` passes (CLI and tests; tools never block)."""
        end = time.time() + timeout
        while time.time() < end:
            rec = self.get(run_id)
            if rec.state.terminal:
                return rec
            time.sleep(poll)
            self.tick()
        return self.get(run_id)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as dead
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True
