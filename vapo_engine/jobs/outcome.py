"""How a run ended, read from the run directory, and whether its processes are alive. Torch-free.

Shared by the supervisor (it knows the worker's exit code) and by recovery in the run manager (it does not:
the supervisor died, so the outcome comes from summary.json, written by the worker itself, and from the
writer lock, held by a live worker).
"""
from __future__ import annotations

import os
from pathlib import Path

from vapo_engine.rundir import SUMMARY_JSON, RunDir

from .states import State

HEARTBEAT_S = 2.0
STALE_AFTER_S = max(30.0, 10 * HEARTBEAT_S)


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (a zombie child of this process counts as dead)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:  # not our child: a zombie nobody reaped yet is dead too
        return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def resume_hint(rd: RunDir) -> str:
    step = rd.latest_checkpoint_step()
    return (f"resume_run continues from the checkpoint at step {step}" if step is not None
            else "no checkpoint was written yet; start_training again")


def final_state(rd: RunDir, rc: int | None, *, stopped: bool, since: float | None = None,
                log_from: int = 0) -> tuple[State, str]:
    """The terminal state and a message with the evidence and the next step. `rc` is the worker's exit code
    (None when nobody saw it exit); `since` ignores a summary.json older than this attempt's start;
    `log_from` is where this attempt's output starts in worker.log (earlier attempts wrote before it)."""
    summary = rd.summary()
    mtime = rd.mtime(SUMMARY_JSON)
    if since is not None and (mtime is None or mtime < since - 1.0):
        summary = {}
    if rc in (0, None) and summary.get("status") == "succeeded":
        gain = summary.get("greedy_accuracy_gain")
        extra = f"; held-out greedy accuracy {gain * 100:+.1f} points" if isinstance(gain, (int, float)) else ""
        return State.SUCCEEDED, f"finished {summary.get('steps')} steps in {summary.get('seconds')}s{extra}"
    if stopped or summary.get("status") == "stopped":
        return State.STOPPED, f"stopped on request; {resume_hint(rd)}"
    tail = rd.log_tail(3, start=log_from)
    if rc is None:
        return State.FAILED, (f"the supervisor and the worker died without reporting (no final summary); "
                              f"last log: {tail!r}; {resume_hint(rd)}")
    if rc == 2:
        return State.FAILED, f"bad input: {tail}"
    if rc < 0:
        return State.FAILED, f"worker killed by signal {-rc}; {resume_hint(rd)}"
    return State.FAILED, f"worker exited with code {rc}: {tail}; {resume_hint(rd)}"
