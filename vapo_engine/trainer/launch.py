"""Single-node multi-process launcher bound to loopback: `python -m vapo_engine.trainer.launch N RUN_DIR [--resume]`.

Why not `torchrun --standalone`: its rendezvous store (a TCPStore) listens on every interface, and its
dynamic rendezvous keeps its state as a pickle in that store, which every agent unpickles — anyone who can
reach the port can make the launcher run code (docs/design.md §7). Here the store is created on a socket this process
bound to 127.0.0.1 (`master_listen_fd`), the ranks connect to it as clients (TORCHELASTIC_USE_AGENT_STORE),
gloo's own sockets are pinned to the loopback interface, and nothing is ever unpickled: the ranks use tensor
collectives only (trainer/distributed.py).

Several nodes need a network rendezvous; that is torchrun's c10d rendezvous, set up only from config.toml or
the CLI (never by an MCP tool), on a network the user trusts (see docs/security.md).

Supervision: SIGTERM/SIGINT are forwarded to every rank (graceful stop: they agree, checkpoint, exit 0); when
one rank fails, the others are terminated (then killed after a grace period) and its exit code is returned.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

GRACE_S = 30.0


def rank_env(rank: int, world: int, port: int, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    env.setdefault("GLOO_SOCKET_IFNAME", _loopback_ifname())
    env.setdefault("NCCL_SOCKET_IFNAME", env["GLOO_SOCKET_IFNAME"])
    return env


def _loopback_ifname() -> str:
    """The name of the loopback interface (lo on Linux, lo0 on macOS)."""
    names = [n for _, n in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in ("lo", "lo0") if n in names), "lo")


def launch(nproc: int, worker_args: list[str]) -> int:
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = TCPStore("127.0.0.1", port, nproc, True, timedelta(minutes=30), wait_for_workers=False,
                     master_listen_fd=sock.fileno())
    sock.detach()  # the store owns (and closes) the listening socket now
    cmd = [sys.executable, "-m", "vapo_engine.trainer", *worker_args]
    ranks = [subprocess.Popen(cmd, env=rank_env(r, nproc, port), stdin=subprocess.DEVNULL) for r in range(nproc)]
    forward = (lambda signum, frame: [p.send_signal(signum) for p in ranks if p.poll() is None])
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return _watch(ranks)
    finally:
        del store


def _watch(ranks: list[subprocess.Popen]) -> int:
    """Wait for every rank; on the first failure stop the rest and return that failure's code."""
    while True:
        codes = [p.poll() for p in ranks]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            _terminate(ranks)
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _terminate(ranks: list[subprocess.Popen]) -> None:
    for p in ranks:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + GRACE_S
    for p in ranks:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python -m vapo_engine.trainer.launch NPROC RUN_DIR [--resume]", file=sys.stderr)
        return 2
    return launch(int(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main())
