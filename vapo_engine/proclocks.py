"""Who holds a lock file, as the kernel says: the only evidence the run manager signals a process on.

A pid, process group or start time read from a run directory (state.json, worker.json) is data that anyone
who can write the directory chooses; signalling it can kill any process of this user (docs/security.md "A run directory is data, never authority"). The
kernel's lock table (/proc/locks, Linux) names the process holding an flock on a file. `holder` returns it
only when the file is a plain file (not a symlink, one link: not a name for another program's lock file)
and the process's command line is the one this package starts (`python -m vapo_engine.trainer RUN_DIR`,
`python -m vapo_engine.jobs.runner ROOT RUN_ID`). Where there is no /proc/locks there is no holder: nothing
is signalled, and the caller says why. Torch-free.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

LOCKS = Path("/proc/locks")


def lock_holder(path: Path) -> int | None:
    """The pid that holds an flock on `path` (None: none, not a plain single-link file, or no /proc/locks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = LOCKS.read_text()
    except OSError:
        return None
    for line in table.splitlines():
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 18465 fe:00:2146529 0 EOF"; waiters have a "->"
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == ident and parts[4].isdigit():
            return int(parts[4]) or None
    return None


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def runs_module(pid: int, module: str, *, path: Path | None = None, arg: str | None = None) -> bool:
    """Whether process `pid` runs `python -m <module>` on the run directory `path` (an argument that resolves
    to it) or with the argument `arg`."""
    args = command_line(pid)
    if module not in args or (arg is not None and arg not in args):
        return False
    return path is None or any(_same(a, path) for a in args)


def holder(path: Path, module: str, *, run_dir: Path | None = None, arg: str | None = None) -> dict | None:
    """{"pid", "pgid"} of the process holding `path` when it runs `module` for this run, else None."""
    pid = lock_holder(path)
    if pid is None or not runs_module(pid, module, path=run_dir, arg=arg):
        return None
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return None
    return {"pid": pid, "pgid": pgid}


def _same(arg: str, path: Path) -> bool:
    try:
        return Path(arg).resolve() == path.resolve()
    except (OSError, ValueError):
        return False
