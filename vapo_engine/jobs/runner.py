"""The detached run supervisor: `python -m vapo_engine.jobs.runner ROOT RUN_ID`.

Started in its own process session by the run manager, so it outlives the MCP server. It starts the trainer
worker in a session of its own (so killing the supervisor does not kill the training, and a force stop can
kill exactly the worker's process group), holds runner.lock for its whole life (the run manager's evidence
that it is this run's supervisor), beats a heartbeat into the registry, forwards a stop request (SIGTERM →
graceful, then SIGKILL after a grace period; SIGUSR1 → SIGKILL at once), records the final state with a
message a person can act on, and then starts the next queued run. Torch-free: it never imports the trainer.

Launch: one process runs `python -m vapo_engine.trainer RUN_DIR`; several processes on this node run the
loopback-bound launcher `python -m vapo_engine.trainer.launch N RUN_DIR`; several nodes (only ever set in
config.toml or on the CLI) use torchrun's c10d rendezvous at `distributed.rdzv_endpoint`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from vapo_engine.childenv import run_needs
from vapo_engine.datafiles import open_append
from vapo_engine.rundir import CONFIG_JSON, WORKER_LOG, RunDir, RunDirBusy, storage_error

from .manager import FORCE_SIGNAL, RunManager
from .outcome import HEARTBEAT_S, final_state
from .registry import Registry
from .states import State
from .threads import worker_env

STOP_GRACE_S = 60.0


def worker_command(run_dir: Path, resume: bool) -> list[str]:
    """The worker's command line for the run's [distributed] section (see the module docstring)."""
    d = (RunDir(run_dir).read_json(CONFIG_JSON) or {}).get("distributed", {})
    nproc, nnodes = int(d.get("nproc_per_node", 1)), int(d.get("nnodes", 1))
    cmd = [sys.executable, "-m", "vapo_engine.trainer", str(run_dir)]
    if nnodes > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--nnodes={nnodes}",
               f"--node_rank={d.get('node_rank', 0)}", "--rdzv_backend=c10d",
               f"--rdzv_endpoint={d.get('rdzv_endpoint')}", f"--rdzv_id={Path(run_dir).name}",
               "-m", "vapo_engine.trainer", str(run_dir)]
    elif nproc > 1:
        cmd = [sys.executable, "-m", "vapo_engine.trainer.launch", str(nproc), str(run_dir)]
    return cmd + (["--resume"] if resume else [])


def supervise(root: Path, run_id: str) -> int:
    signal.signal(signal.SIGTERM, lambda *_: _asked("stop"))  # before anything: a stop is never lost
    signal.signal(FORCE_SIGNAL, lambda *_: _asked("force"))
    reg = Registry(root)
    rec = reg.get(run_id)
    if rec is None:
        return 2
    rd = RunDir(rec.run_dir)
    try:
        lock = rd.acquire_supervisor()  # noqa: F841 - held until this process exits
    except RunDirBusy as e:
        reg.transition(run_id, State.FAILED, f"not started: {e}")
        return 1
    log_from = rd.log_size()
    rd.record_attempt(run_id, {"log_offset": log_from})
    reg.update(run_id, pid=os.getpid(), heartbeat=time.time(), message="training; poll run_status")
    try:
        log_file = open_append(rd.file(WORKER_LOG), binary=True, buffering=0)  # never through a planted link
    except OSError as e:
        reg.transition(run_id, State.FAILED, f"not started: {storage_error(rd.file(WORKER_LOG), e)}")
        return 1
    with log_file as log:
        if _ASKED:
            rc = None
        else:
            _CHILD.append(subprocess.Popen(worker_command(rec.run_dir, rec.resume), stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True, env=worker_env(nprocs=rec.nprocs,
                                                          keep=run_needs(rd.config()))))
            rc = _supervise_child(reg, rd, run_id, _CHILD[0])
    state, message = final_state(rd, rc, stopped=bool(_ASKED), since=rec.started, log_from=log_from)
    reg.transition(run_id, state, message, exit_code=rc)
    RunManager(root).tick()
    return 0


def _supervise_child(reg: Registry, rd: RunDir, run_id: str, child: subprocess.Popen) -> int:
    rd.record_attempt(run_id, {"worker_pid": child.pid})  # shown only; nothing signals a pid read from here
    if _ASKED:  # asked while the worker was being started
        _act(_ASKED[-1], child)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(reg, run_id, child, stop), daemon=True).start()
    rc = child.wait()
    stop.set()
    return rc


_ASKED: list[str] = []
_CHILD: list[subprocess.Popen] = []


def _asked(kind: str) -> None:
    """SIGTERM ("stop": the worker checkpoints, then exits; killed after STOP_GRACE_S) or SIGUSR1 ("force":
    SIGKILL to the worker's process group at once), whenever it arrives."""
    _ASKED.append(kind)
    if _CHILD:
        _act(kind, _CHILD[0])


def _act(kind: str, child: subprocess.Popen) -> None:
    if kind == "force":
        _kill_group(child.pid)
    elif child.poll() is None:
        child.send_signal(signal.SIGTERM)
        threading.Timer(STOP_GRACE_S, lambda: child.poll() is None and _kill_group(child.pid)).start()


def _kill_group(pgid: int) -> None:
    """SIGKILL the worker's whole process group (a launcher and its ranks), not only its first process."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _heartbeat(reg: Registry, run_id: str, child: subprocess.Popen, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        if child.poll() is not None:
            return
        try:
            reg.update(run_id, heartbeat=time.time())
        except Exception as e:  # noqa: BLE001 - a missed beat (registry briefly unusable) must not end supervision
            print(f"heartbeat skipped: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), sys.argv[2]))
