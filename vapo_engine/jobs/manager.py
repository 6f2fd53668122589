"""The run manager: submit, queue, start detached supervisors, stop, resume, recover. Torch-free.

Runs execute as `python -m vapo_engine.jobs.runner` (the supervisor) in their own process session, so they
outlive the server; the supervisor starts the worker in a session of its own. At most `max_concurrent` run at
once (default 1: two runs never fight over one device); the rest wait queued and start when a slot frees
(each finishing runner and every manager call tick the queue).

Two processes per run, two kinds of evidence: the supervisor beats a heartbeat into the registry; the worker
holds the run directory's writer lock for its whole life (`RunDir.writer()`). `recover()` uses both, so a
dead supervisor never makes a live worker look dead, and nothing starts a second writer while the lock is held.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vapo_engine.errors import UserError
from vapo_engine.rundir import RUNNER_LOG, RunDir, storage_error

from . import outcome, threads
from .registry import Registry, RunIdTaken, RunRecord
from .states import State

log = logging.getLogger("vapo_mcp.jobs")


class RunError(UserError):
    """A request the caller can fix (unknown run id, wrong state), with the fix in the message."""


class RunManager:
    def __init__(self, root: str | Path, max_concurrent: int | None = None):
        self.root = Path(root)
        self.registry = Registry(self.root)
        self.max_concurrent = max_concurrent or threads.max_concurrent()

    def submit(self, run_id: str, experiment: str, tags, run_dir: Path, *, group_id: str | None = None,
               variant: str | None = None, nprocs: int = 1) -> RunRecord:
        self.registry.add(run_id, experiment, tags, run_dir, group_id=group_id, variant=variant, nprocs=nprocs)
        self.tick()
        return self.registry.get(run_id)

    def tick(self) -> list[str]:
        """Recover runs whose supervisor died, then start queued runs while slots are free. Returns the
        started run ids."""
        self.recover()
        started = []
        for rec in self.registry.claim_queued(self.max_concurrent):
            self._spawn(rec)
            started.append(rec.run_id)
        return started

    def _spawn(self, rec: RunRecord) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            with open(rec.run_dir / RUNNER_LOG, "ab") as out:
                p = subprocess.Popen([sys.executable, "-m", "vapo_engine.jobs.runner", str(self.root),
                                      rec.run_id], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env, close_fds=True)
        except OSError as e:
            self.registry.transition(rec.run_id, State.FAILED, f"could not start its supervisor: {e}")
            raise storage_error(rec.run_dir / RUNNER_LOG, e) from None
        self.registry.update(rec.run_id, pid=p.pid, heartbeat=time.time())

    def recover(self) -> list[str]:
        """For every running run whose supervisor is gone (no process, a reused pid, or no heartbeat for
        STALE_AFTER_S):
        - its worker still holds the writer lock → it stays running (the message says so; stop_run works);
        - its worker is gone too → the end is read from the run directory: succeeded or stopped when the
          worker wrote that in summary.json during this attempt, else failed with the evidence and the resume
          path. A run whose directory cannot be read is skipped (logged), never a failure of the caller.
        Returns the run ids that reached a terminal state here."""
        ended = []
        for rec in self.registry.list(state=State.RUNNING.value, limit=10_000):
            try:
                if self._recover_one(rec):
                    ended.append(rec.run_id)
            except Exception as e:  # noqa: BLE001 - one damaged run directory must not block every tool call
                log.warning("recovery skipped run %s: %s", rec.run_id, e)
        return ended

    def _recover_one(self, rec: RunRecord) -> bool:
        if self._supervised(rec):
            return False
        rd = RunDir(rec.run_dir)
        holder = rd.writer()
        if holder:
            msg = (f"its supervisor (pid {rec.pid}) is gone, but the worker (pid {holder.get('pid')}) is still "
                   f"training; stop_run('{rec.run_id}') stops it; the state is updated when it ends")
            if rec.message != msg:
                self.registry.update(rec.run_id, message=msg)
            return False
        attempt = rd.attempts().get(rec.run_id, {})
        state, msg = outcome.final_state(rd, None, stopped=False, since=rec.started,
                                         log_from=int(attempt.get("log_offset") or 0))
        return self.registry.transition(rec.run_id, state, msg)

    def _supervisor(self, rec: RunRecord) -> int | None:
        """The supervisor's pid while it is alive, is the recorded process (start time) and beats."""
        beat = rec.heartbeat or rec.started or rec.created
        if rec.pid is None or time.time() - beat >= outcome.STALE_AFTER_S:
            return None
        start = RunDir(rec.run_dir).attempts().get(rec.run_id, {}).get("supervisor_start")
        return rec.pid if outcome.same_process(rec.pid, start) else None

    def _supervised(self, rec: RunRecord) -> bool:
        beat = rec.heartbeat or rec.started or rec.created
        just_claimed = rec.pid is None and time.time() - beat < outcome.STALE_AFTER_S
        return just_claimed or self._supervisor(rec) is not None

    def get(self, run_id: str) -> RunRecord:
        rec = self.registry.get(run_id) if run_id else None
        if rec is None:
            known = ", ".join(r.run_id for r in self.registry.list(limit=5)) or "none yet"
            raise RunError(f"unknown run id {run_id!r}; recent runs: {known} (list_runs shows all)")
        return rec

    def stop(self, run_id: str, *, force: bool = False) -> RunRecord:
        """Graceful: the worker checkpoints, then exits (through its supervisor when that is alive). Force:
        SIGKILL to the supervisor's and the worker's process groups. A run already marked terminal whose
        worker still holds the writer lock is stopped too (its state cannot have been right)."""
        rec = self.get(run_id)
        rd = RunDir(rec.run_dir)
        worker = _worker(rd, rec.run_id)
        if rec.state.terminal and worker is None:
            nxt = (f"resume_run('{run_id}') continues it" if rec.state is not State.SUCCEEDED
                   else f"report_metrics('{run_id}') shows its results")
            raise RunError(f"run {run_id} is already {rec.state.value}, so there is nothing to stop; {nxt}, or "
                           "list_runs(state='running') shows the runs that can be stopped")
        if rec.state is State.QUEUED:
            self.registry.transition(run_id, State.STOPPED, "stopped before it started")
            return self.get(run_id)
        supervisor = None if rec.state.terminal else self._supervisor(rec)
        if force:
            _signal_group(supervisor, signal.SIGKILL)  # the supervisor first: it must not report
            _signal_group((worker or {}).get("pgid"), signal.SIGKILL)
            msg = f"force-stopped (SIGKILL); {outcome.resume_hint(rd)}"
            if not self.registry.transition(run_id, State.STOPPED, msg):
                self.registry.update(run_id, message=f"{rec.message}; its stray worker was then force-stopped")
        elif rec.state.terminal:
            _signal(worker["pid"], signal.SIGTERM)
            self.registry.update(run_id, message=f"{rec.message}; its stray worker (pid {worker['pid']}) was asked "
                                 "to stop (it checkpoints, then exits)")
        elif supervisor:
            _signal(supervisor, signal.SIGTERM)  # it forwards the request and records the end
        elif worker and worker.get("pid"):
            _signal(worker["pid"], signal.SIGTERM)
            self.registry.update(run_id, message=f"stop requested from the worker (pid {worker['pid']}) directly "
                                 "(its supervisor is gone); it checkpoints, then exits; poll run_status")
        return self.get(run_id)

    def resume(self, run_id: str) -> RunRecord:
        rec = self.get(run_id)
        if not rec.state.terminal or rec.state is State.SUCCEEDED:
            nxt = ("start_training for a new run (to train further, raise training.total_steps)"
                   if rec.state is State.SUCCEEDED else f"stop_run('{run_id}') first, or let it finish")
            raise RunError(f"run {run_id} is {rec.state.value}; only failed or stopped runs can be resumed: {nxt}")
        rd = RunDir(rec.run_dir)
        holder = rd.writer()
        if holder:
            raise RunError(f"a worker (pid {holder.get('pid')}) is still writing run {run_id}'s directory; "
                           f"stop it first (stop_run('{run_id}', force=True)) or wait for it to end")
        ok, broken = rd.usable_checkpoints()
        damaged = "; ".join(f"{p.name}: {why}" for p, why in broken)
        if not ok:
            raise RunError(f"run {run_id} has no complete checkpoint to resume from"
                           + (f" (damaged: {damaged})" if damaged else "") + "; start_training again")
        new_id = self._add_attempt(rec)
        if damaged:
            self.registry.update(new_id, message=f"queued; resumes from {ok[0].name}, skipping damaged {damaged}")
        self.tick()
        return self.get(new_id)

    def _add_attempt(self, rec: RunRecord) -> str:
        """Register the next attempt `<base>-rN` of a run (a concurrent resume that took N makes us take N+1)."""
        base = rec.run_id.split("-r")[0] if "-r" in rec.run_id[-4:] else rec.run_id
        n = 1 + sum(1 for r in self.registry.list(limit=10_000) if r.run_id.startswith(base + "-r"))
        for k in range(n, n + 50):
            try:
                self.registry.add(f"{base}-r{k}", rec.experiment, rec.tags, rec.run_dir, resumed_from=rec.run_id,
                                  group_id=rec.group_id, variant=rec.variant, resume=True, nprocs=rec.nprocs)
                return f"{base}-r{k}"
            except RunIdTaken:
                continue
        raise RunError(f"could not register a new attempt of run {rec.run_id}; try resume_run again")

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


def _worker(rd: RunDir, run_id: str) -> dict | None:
    """The run's live worker: the writer lock's holder, or (before it took the lock) the worker process the
    supervisor recorded for this attempt, while it is still that process."""
    holder = rd.writer()
    if holder:
        return holder
    rec = rd.attempts().get(run_id, {})
    if outcome.same_process(rec.get("worker_pid"), rec.get("worker_start")) and rec.get("worker_start"):
        return {"pid": rec["worker_pid"], "pgid": rec.get("worker_pgid")}
    return None


def _signal(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid and pgid != os.getpgid(0):  # never our own group
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
