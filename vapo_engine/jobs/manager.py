"""The run manager: submit, queue, start detached supervisors, stop, resume, recover. Torch-free.

Runs execute as `python -m vapo_engine.jobs.runner` (the supervisor) in their own process session, so they
outlive the server; the supervisor starts the worker in a session of its own. At most `max_concurrent` run at
once (default 1: two runs never fight over one device); the rest wait queued and start when a slot frees
(each finishing runner and every manager call tick the queue).

Two processes per run, two kinds of evidence: the supervisor holds runner.lock and beats a heartbeat into the
registry; the worker holds the run directory's writer lock for its whole life (`RunDir.writer()`).
`recover()` uses both, so a dead supervisor never makes a live worker look dead, and nothing starts a second
writer while the lock is held.

A run directory is data, never authority (docs/security.md "A run directory is data, never authority"). Signals go only to the process the kernel names as the
holder of the run's lock, when its command line is the supervisor or trainer of that run (`proclocks`) —
never to a pid, process group or start time read from state.json or worker.json. The worker's settings are
this server's (`settings_path`, passed in the environment as `SETTINGS_ENV`), never a path from run.json.
`resume` is idempotent (a second call gets the attempt the first one queued), `stop` cancels the run's queued
attempts too, and at most `max_queued` runs wait (settings.json runtime.max_queued_runs).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vapo_engine.childenv import child_env, run_needs
from vapo_engine.datafiles import open_append
from vapo_engine.errors import UserError
from vapo_engine.rundir import RUNNER_LOG, RunDir, storage_error

from . import outcome, threads
from .registry import Registry, RunIdTaken, RunRecord, family_of, queue_full
from .states import State
from .threads import SETTINGS_ENV

log = logging.getLogger("vapo_mcp.jobs")
FORCE_SIGNAL = signal.SIGUSR1
"""Asks a supervisor to SIGKILL its worker's process group at once (the supervisor knows its own child)."""


class RunError(UserError):
    """A request the caller can fix (unknown run id, wrong state), with the fix in the message."""


LIST_HINT = "(list_runs shows all)"
"""How an unknown run id's message says where the ids are (tools.hints spells it `vapo-mcp runs list` at the CLI)."""


class RunManager:
    def __init__(self, root: str | Path, max_concurrent: int | None = None, *, settings_path: Path | None = None,
                 max_queued: int | None = None):
        self.root = Path(root)
        self.registry = Registry(self.root)
        self.max_concurrent = max_concurrent or threads.max_concurrent()
        self.settings_path = Path(settings_path).resolve() if settings_path else None
        self.max_queued = max_queued

    def submit(self, run_id: str, experiment: str, tags, run_dir: Path, *, group_id: str | None = None,
               variant: str | None = None, nprocs: int = 1) -> RunRecord:
        self.registry.add(run_id, experiment, tags, run_dir, group_id=group_id, variant=variant, nprocs=nprocs,
                          max_queued=self.max_queued)
        self.tick()
        return self.registry.get(run_id)

    def check_room(self, runs: int = 1) -> None:
        """`QueueFull` when fewer than `runs` more may wait now (each is checked again, atomically, when it is
        queued: this check only spares creating run directories that could not be queued)."""
        if self.max_queued is not None and (queued := self.registry.queued()) + runs > self.max_queued:
            raise queue_full(queued, self.max_queued, runs)

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
        env = supervisor_env(rec.run_dir)
        if self.settings_path is not None:
            env[SETTINGS_ENV] = str(self.settings_path)
        try:
            with open_append(rec.run_dir / RUNNER_LOG, binary=True) as out:
                p = subprocess.Popen([sys.executable, "-m", "vapo_engine.jobs.runner", str(self.root),
                                      rec.run_id], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env, close_fds=True)
        except OSError as e:
            self.registry.transition(rec.run_id, State.FAILED, f"could not start its supervisor: {e}")
            raise storage_error(rec.run_dir / RUNNER_LOG, e) from None
        _STARTED[rec.run_id] = p
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

    def _supervised(self, rec: RunRecord) -> bool:
        """Whether the run's supervisor is alive: it holds runner.lock, or it was started moments ago and has
        not taken the lock yet (a liveness judgement only: nothing is signalled on the latter)."""
        if _supervisor(rec) is not None:
            return True
        beat = rec.heartbeat or rec.started or rec.created
        fresh = time.time() - beat < outcome.STALE_AFTER_S
        return fresh and (rec.pid is None or outcome.pid_alive(rec.pid))

    def get(self, run_id: str) -> RunRecord:
        rec = self.registry.get(run_id) if run_id else None
        if rec is None:
            known = ", ".join(r.run_id for r in self.registry.list(limit=5)) or "none yet"
            raise RunError(f"unknown run id {run_id!r}; recent runs: {known} {LIST_HINT}")
        return rec

    def stop(self, run_id: str, *, force: bool = False) -> RunRecord:
        """Graceful: the worker checkpoints, then exits (through its supervisor when that is alive). Force: the
        supervisor kills its worker's process group at once, and the worker holding the writer lock is killed
        too. Queued attempts of the same run are cancelled. A run already marked terminal whose worker still
        holds the writer lock is stopped too (its state cannot have been right). Only processes the kernel
        names as holders of this run's locks are signalled (module docstring)."""
        rec = self.get(run_id)
        rd = RunDir(rec.run_dir)
        cancelled = self._cancel_queued(rec)
        worker = rd.writer()
        if rec.state.terminal and worker is None:
            if cancelled:
                return self.get(cancelled[0])
            nxt = (f"resume_run('{run_id}') continues it" if rec.state is not State.SUCCEEDED
                   else f"report_metrics('{run_id}') shows its results")
            raise RunError(f"run {run_id} is already {rec.state.value}, so there is nothing to stop; {nxt}, or "
                           "list_runs(state='running') shows the runs that can be stopped")
        if rec.state is State.QUEUED:
            return self.get(run_id)
        supervisor = None if rec.state.terminal else _supervisor(rec)
        if force:
            self._force(rec, rd, supervisor, worker)
        elif rec.state.terminal:
            self._ask(worker, run_id, f"{rec.message}; its stray worker was asked to stop (it checkpoints, then "
                                      "exits)")
        elif supervisor:
            _signal(supervisor["pid"], signal.SIGTERM)  # it forwards the request and records the end
        elif worker:
            self._ask(worker, run_id, f"stop requested from the worker (pid {worker.get('pid')}) directly (its "
                                      "supervisor is gone); it checkpoints, then exits; poll run_status")
        return self.get(run_id)

    def _cancel_queued(self, rec: RunRecord) -> list[str]:
        """Stop every queued attempt of `rec`'s run (a stop must not be undone by an attempt starting later)."""
        family = family_of(rec.run_id)
        out = []
        for other in self.registry.list(state=State.QUEUED.value, limit=10_000):
            if family_of(other.run_id) == family and self.registry.transition(
                    other.run_id, State.STOPPED, f"cancelled before it started: stop_run('{rec.run_id}')"):
                out.append(other.run_id)
        return out

    def _force(self, rec: RunRecord, rd: RunDir, supervisor: dict | None, worker: dict | None) -> None:
        if supervisor:
            _signal(supervisor["pid"], FORCE_SIGNAL)  # it SIGKILLs its own worker, even before the lock
        if worker and worker.get("pgid"):
            _signal_group(worker["pgid"], signal.SIGKILL)
        unverified = worker is not None and not worker.get("pgid")
        msg = f"force-stopped (SIGKILL); {outcome.resume_hint(rd)}"
        if unverified:
            msg = ("the worker holding the run's lock could not be identified as this run's trainer, so nothing "
                   f"was killed; stop it yourself (it holds {rd.path / 'worker.lock'})")
        if not self.registry.transition(rec.run_id, State.STOPPED, msg):
            self.registry.update(rec.run_id, message=f"{rec.message}; its stray worker was then force-stopped"
                                 if not unverified else msg)

    def _ask(self, worker: dict | None, run_id: str, message: str) -> None:
        if worker and worker.get("pid"):
            _signal(worker["pid"], signal.SIGTERM)
            self.registry.update(run_id, message=message)

    def resume(self, run_id: str) -> RunRecord:
        """Queue the next attempt of a failed or stopped run; while an attempt of the run is queued or running,
        return that attempt instead (idempotent)."""
        rec = self.get(run_id)
        live = next((r for r in self.registry.list(limit=10_000) if family_of(r.run_id) == family_of(run_id)
                     and not r.state.terminal), None)
        if live is not None and live.resume:
            return live  # a resume made it: a second resume_run gets the same attempt
        if live is not None or rec.state is State.SUCCEEDED:
            nxt = ("start_training for a new run (to train further, raise training.total_steps)"
                   if live is None else f"stop_run('{live.run_id}') first, or let it finish")
            raise RunError(f"run {(live or rec).run_id} is {(live or rec).state.value}; only failed or stopped runs "
                           f"can be resumed: {nxt}")
        rd = RunDir(rec.run_dir)
        holder = rd.writer()
        if holder:
            raise RunError(f"a worker (pid {holder.get('pid') or '?'}) is still writing run {run_id}'s directory; "
                           f"stop it first (stop_run('{run_id}', force=True)) or wait for it to end")
        rd.refuse_linked_subfolders()
        ok, broken = rd.usable_checkpoints()
        damaged = "; ".join(f"{p.name}: {why}" for p, why in broken)
        if not ok:
            raise RunError(f"run {run_id} has no complete checkpoint to resume from"
                           + (f" (damaged: {damaged})" if damaged else "") + "; start_training again")
        new = self._add_attempt(rec)
        if damaged and new.state is State.QUEUED:
            self.registry.update(new.run_id, message=f"queued; resumes from {ok[0].name}, skipping damaged {damaged}")
        self.tick()
        return self.get(new.run_id)

    def _add_attempt(self, rec: RunRecord) -> RunRecord:
        """Register the next attempt `<family>-rN` of a run, or get the family's live attempt when a concurrent
        resume made one (the registry checks both in one transaction)."""
        family = family_of(rec.run_id)
        n = 1 + sum(1 for r in self.registry.list(limit=10_000) if family_of(r.run_id) == family
                    and r.run_id != family)
        for k in range(n, n + 50):
            try:
                return self.registry.add(f"{family}-r{k}", rec.experiment, rec.tags, rec.run_dir,
                                         resumed_from=rec.run_id, group_id=rec.group_id, variant=rec.variant,
                                         resume=True, nprocs=rec.nprocs, max_queued=self.max_queued,
                                         family=family)
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


_STARTED: dict[str, subprocess.Popen] = {}


def supervisor_env(run_dir: Path, base: dict | None = None) -> dict:
    """The run supervisor's environment: this server's, unbuffered, without the server's bearer token unless the
    run's rollout replicas take it (vapo_engine/childenv.py)."""
    return dict(child_env(base, keep=run_needs(RunDir(run_dir).config())), PYTHONUNBUFFERED="1")
"""Supervisors this process started, by run id: its own children, so their pids cannot have been reused."""


def _supervisor(rec: RunRecord) -> dict | None:
    """The run's live supervisor: the process holding its runner.lock, or one this process started moments
    ago that has not taken the lock yet."""
    held = RunDir(rec.run_dir).supervisor(rec.run_id)
    if held is not None:
        return held
    child = _STARTED.get(rec.run_id)
    return {"pid": child.pid, "pgid": child.pid} if child is not None and child.poll() is None else None


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
