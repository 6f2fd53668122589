"""The detached run supervisor: `python -m vapo_engine.jobs.runner ROOT RUN_ID`.

Started in its own process session by the run manager, so it outlives the MCP server. It starts the trainer
worker (torchrun when the run asks for several processes), beats a heartbeat into the registry, forwards a
stop request (SIGTERM → graceful, then SIGKILL after a grace period), records the final state with a message
a person can act on, and then starts the next queued run. Torch-free: it never imports the trainer.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .registry import Registry
from .states import State

HEARTBEAT_S = 2.0
STOP_GRACE_S = 60.0


def worker_command(run_dir: Path, resume: bool) -> list[str]:
    """`python -m vapo_engine.trainer RUN_DIR`, under torchrun when the run's [distributed] section asks
    for more than one process (standalone rendezvous on one node, c10d at rdzv_endpoint across nodes)."""
    d = _read_json(Path(run_dir) / "config.json").get("distributed", {})
    nproc, nnodes = int(d.get("nproc_per_node", 1)), int(d.get("nnodes", 1))
    cmd = [sys.executable, "-m", "vapo_engine.trainer", str(run_dir)]
    if nproc * nnodes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
        if nnodes > 1:
            launch += [f"--nnodes={nnodes}", f"--node_rank={d.get('node_rank', 0)}", "--rdzv_backend=c10d",
                       f"--rdzv_endpoint={d.get('rdzv_endpoint')}", f"--rdzv_id={Path(run_dir).name}"]
        else:
            launch += ["--standalone"]
        cmd = launch + ["-m", "vapo_engine.trainer", str(run_dir)]
    return cmd + (["--resume"] if resume else [])


def supervise(root: Path, run_id: str) -> int:
    reg = Registry(root)
    rec = reg.get(run_id)
    if rec is None:
        return 2
    reg.update(run_id, pid=os.getpid(), heartbeat=time.time(), message="training; poll run_status")
    log = open(rec.run_dir / "worker.log", "ab", buffering=0)
    child = subprocess.Popen(worker_command(rec.run_dir, rec.resume), stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_worker_env())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: _request_stop(child, stop))
    beat = threading.Thread(target=_heartbeat, args=(reg, run_id, child, stop), daemon=True)
    beat.start()
    rc = child.wait()
    stop.set()
    log.close()
    state, message = final_state(rec.run_dir, rc, stopped=_stop_requested(child))
    reg.transition(run_id, state, message, exit_code=rc)
    from .manager import RunManager
    RunManager(root).tick()
    return 0


def _worker_env() -> dict:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


_STOP_ASKED: set[int] = set()


def _request_stop(child: subprocess.Popen, stop: threading.Event) -> None:
    _STOP_ASKED.add(child.pid)
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        threading.Timer(STOP_GRACE_S, lambda: child.poll() is None and child.kill()).start()


def _stop_requested(child: subprocess.Popen) -> bool:
    return child.pid in _STOP_ASKED


def _heartbeat(reg: Registry, run_id: str, child: subprocess.Popen, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        if child.poll() is not None:
            return
        reg.update(run_id, heartbeat=time.time())


def final_state(run_dir: Path, rc: int, *, stopped: bool) -> tuple[State, str]:
    """Map the worker's exit to a terminal state and a message with the evidence and the next step."""
    summary = _read_json(run_dir / "summary.json")
    ckpt = _latest_step(run_dir)
    resume_hint = (f"resume_run continues from the checkpoint at step {ckpt}" if ckpt is not None
                   else "no checkpoint was written yet; start_training again")
    if rc == 0 and summary.get("status") == "succeeded":
        gain = summary.get("greedy_accuracy_gain")
        extra = f"; held-out greedy accuracy {gain * 100:+.1f} points" if isinstance(gain, (int, float)) else ""
        return State.SUCCEEDED, f"finished {summary.get('steps')} steps in {summary.get('seconds')}s{extra}"
    if stopped or summary.get("status") == "stopped":
        return State.STOPPED, f"stopped on request; {resume_hint}"
    tail = log_tail(run_dir / "worker.log", 3)
    if rc == 2:
        return State.FAILED, f"bad input: {tail}"
    if rc < 0:
        return State.FAILED, f"worker killed by signal {-rc}; {resume_hint}"
    return State.FAILED, f"worker exited with code {rc}: {tail}; {resume_hint}"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _latest_step(run_dir: Path) -> int | None:
    done = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "DONE").is_file())
    return int(done[-1].name.split("-")[1]) if done else None


def log_tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])[-max_chars:]


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), sys.argv[2]))
