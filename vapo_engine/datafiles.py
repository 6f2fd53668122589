"""Files in a run directory, opened the one safe way: never through a symbolic link, only when regular.

A run directory is data (docs/security.md): whoever can write it (a shared log dir) may plant a symlink where a
run file goes — `metrics.jsonl` → `~/.bashrc` would have the trainer append to the user's shell profile, a
`worker.log` → `/etc/shadow` would have run_status read it out — or a FIFO, which blocks a reader forever (the
MCP server would hang). So every open of a run file goes through here:

- `open_read` / `read_bytes` / `read_text`: `O_NOFOLLOW | O_NONBLOCK` (a FIFO opens at once instead of waiting
  for a writer), then `fstat` on the open descriptor must say regular file; else `NotRegularFile` (an OSError,
  so a reader that treats an unreadable file as missing keeps doing so).
- `open_append`: the same for the append-only files (metrics.jsonl, worker.log, runner.log,
  provider_cache.jsonl); a missing file is created.
- `write_atomic`: a new file under a random name in the same folder (`tempfile.mkstemp`: O_CREAT | O_EXCL, so a
  planted name is never followed), then `os.replace` onto the target (which replaces a symlink there, never
  writes through it). Readers see the old or the new file, never half of one.

Only the last path component is checked (the run directory itself is checked by the run views: a run folder
that is a symlink is refused there). Torch-free and dependency-free.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
WHY = "a symbolic link or not a regular file; run files are never read or written through links"


class NotRegularFile(OSError):
    """The path is a symlink, a FIFO, a device, a socket or a folder: refused, never opened for data."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(errno.ELOOP, WHY, str(path))


def _open(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """A descriptor of the regular file `path` (its last component not a symlink), blocking mode restored."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):  # a symlink (ELOOP), a FIFO without a reader
            raise NotRegularFile(path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_read(path: str | os.PathLike, *, text: bool = False, errors: str = "strict"):
    """The regular file `path` open for reading (binary, or UTF-8 text); `NotRegularFile` otherwise."""
    fd = _open(path, os.O_RDONLY)
    return os.fdopen(fd, "r", encoding="utf-8", errors=errors) if text else os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of the regular file `path` (at most `limit`)."""
    with open_read(path) as f:
        return f.read() if limit is None else f.read(limit)


def read_text(path: str | os.PathLike, limit: int | None = None, errors: str = "strict") -> str:
    """The UTF-8 text of the regular file `path` (its first `limit` bytes at most)."""
    return read_bytes(path, limit).decode("utf-8", errors)


def open_append(path: str | os.PathLike, *, binary: bool = False, buffering: int = -1):
    """The regular file `path` (created when missing) open for appending; `NotRegularFile` when it is a symlink
    or anything but a regular file."""
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if binary:
        return os.fdopen(fd, "ab", buffering=buffering)
    return os.fdopen(fd, "a", buffering=buffering, encoding="utf-8")


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically, through a randomly named temporary file in the same folder."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
