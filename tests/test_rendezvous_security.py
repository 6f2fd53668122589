"""Multi-process runs never unpickle peer data and listen on loopback only (docs/security.md, trainer side).

A process that joins a run's rendezvous as another rank could make a worker unpickle (run) its data through
object collectives, and torchrun's own dynamic rendezvous keeps a pickle in a store that listens on every
interface. Checked here on a real 2-rank gloo run: an import hook makes any unpickling in the launcher or the
ranks leave a marker, and the listening sockets of the whole process tree are sampled while it trains.
"""
from __future__ import annotations

import ast
import ipaddress
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.engine_helpers import make_run

OBJECT_COLLECTIVES = {"broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                      "send_object_list", "recv_object_list", "broadcast_object"}

GUARD = """
import os, pickle, _pickle
MARK = os.environ["UNPICKLE_MARKER"]
def _tripped(*a, **k):
    with open(MARK, "a") as f:
        f.write(f"pid {os.getpid()} unpickled\\n")
    raise RuntimeError("unpickling is forbidden in this test")
class _Guarded(pickle.Unpickler):
    def load(self):
        _tripped()
pickle.loads = pickle.load = _pickle.loads = _pickle.load = _tripped
pickle.Unpickler = _pickle.Unpickler = _Guarded
"""


def test_no_object_collectives_anywhere():
    """Static: no code of the project calls an object collective (they unpickle what peers send)."""
    hits = []
    for folder in ("vapo_engine", "tools", "server", "bench", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in OBJECT_COLLECTIVES:
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    assert hits == []


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


def _listening(pids: list[int]) -> set[str]:
    """'address:port' of every TCP socket in LISTEN state owned by one of `pids` (from /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                addr, port = cols[1].split(":")
                found.add(f"{_addr(addr)}:{int(port, 16)}")
    return found


def _addr(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # /proc prints host-order words
    ip = ipaddress.ip_address(words)
    return ip.ipv4_mapped.compressed if getattr(ip, "ipv4_mapped", None) else ip.compressed


@pytest.mark.two_processes
def test_two_rank_run_unpickles_nothing_and_listens_on_loopback_only(tmp_path, model_dir):
    run_dir = make_run(tmp_path, model_dir, ["training.total_steps=4", "distributed.nproc_per_node=2",
                                             "eval.eval_interval=2", "eval.save_interval=100"])
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "sitecustomize.py").write_text(GUARD)
    marker = tmp_path / "unpickled.txt"
    from vapo_engine.jobs.runner import worker_command
    from vapo_engine.jobs.threads import worker_env
    env = worker_env(nprocs=2, base=dict(os.environ, UNPICKLE_MARKER=str(marker),
                                         PYTHONPATH=os.pathsep.join([str(tmp_path / "guard"), str(ROOT)])))
    cmd = worker_command(run_dir, False)
    assert cmd[1:3] == ["-m", "vapo_engine.trainer.launch"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        seen |= _listening(_tree(proc.pid))
        time.sleep(0.2)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "done: succeeded after 4 steps" in out
    assert not marker.exists(), marker.read_text()
    assert seen, "no listening socket was observed (the sampling missed the run)"
    assert all(s.startswith(("127.", "::1:")) for s in seen), seen
