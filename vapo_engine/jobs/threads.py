"""CPU threads for worker processes, sized so that concurrent runs do not oversubscribe the cores. Torch-free.

torch sizes its OpenMP pool to every core by default, and OpenMP threads spin while they wait. Two runs on
two cores then keep four threads busy-waiting against each other, and a step becomes many times slower. A
worker therefore gets `cores // (processes per run × concurrent runs)` threads (at least 1). Waiting threads
yield (`OMP_WAIT_POLICY=PASSIVE`) only where processes can share cores: more than one concurrent run allowed
(`VAPO_MCP_MAX_CONCURRENT` > 1), or more threads in all than cores. A run that has the cores to itself keeps
OpenMP's default (spinning) wait: passive waiting made a run alone 1.5–2× slower per step (docs/experiments.md "How a number is produced"). A value
the user set in the environment always wins.
"""
from __future__ import annotations

import os

from vapo_engine.childenv import child_env

MAX_CONCURRENT_ENV = "VAPO_MCP_MAX_CONCURRENT"
SETTINGS_ENV = "VAPO_MCP_SETTINGS"
"""The settings.json of the server that started a run: its worker resolves the API channel from it, never from
a path recorded in the run directory (a run directory is data)."""
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, e.g. a container's CPU set), else the CPU count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def max_concurrent(env=None) -> int:
    try:
        return max(1, int((env if env is not None else os.environ).get(MAX_CONCURRENT_ENV, "1")))
    except ValueError:
        return 1


def threads_per_process(nprocs: int = 1, concurrent: int = 1, cores: int | None = None) -> int:
    return max(1, (cores or usable_cores()) // max(1, nprocs * concurrent))


def shares_cores(nprocs: int, concurrent: int, threads: int, cores: int | None = None) -> bool:
    """Whether worker threads may have to share cores: several runs at once, or more threads than cores."""
    return concurrent > 1 or nprocs * threads > (cores or usable_cores())


def worker_env(nprocs: int = 1, concurrent: int | None = None, base: dict | None = None,
               keep: tuple[str, ...] = ()) -> dict:
    """The environment of a trainer worker: thread budget, passive waiting where cores are shared, offline hub,
    unbuffered output; the server's token only where `keep` names it (vapo_engine/childenv.py)."""
    env = child_env(base, keep=keep)
    concurrent = concurrent or max_concurrent(env)
    n = threads_per_process(nprocs, concurrent)
    for var in THREAD_VARS:
        env.setdefault(var, str(n))
    try:
        n = int(env["OMP_NUM_THREADS"])  # the user's own value, where they set one
    except ValueError:
        pass
    if shares_cores(nprocs, concurrent, n):
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env
