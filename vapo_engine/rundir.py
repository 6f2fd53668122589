"""The run directory's one owner: its layout, and every read and write of it outside the trainer's tensors.

Layout of `<runtime.log_dir>/<experiment.name>/<run id>/`:
  run.json        identity: id, experiment, tags, seed, created, overrides, preset (written once)
  config.json     the frozen, validated TrainConfig the worker trains with
  settings.json   the settings snapshot + the effective channel (key redacted)
  state.json      every attempt's registry record (state, message, times): the source of truth the run
                  registry is rebuilt from
  summary.json    the worker's final status and start/final evaluation
  metrics.jsonl   append-only metrics (trainer)
  worker.log      the worker's output;  runner.log  the supervisor's own output
  worker.lock     held (flock) by the one process that writes this directory, for its whole life
  worker.json     who holds it: host, start time (shown only: who may be signalled is the kernel's answer)
  runner.lock     held (flock) by the run's supervisor (jobs/runner.py) for its whole life
  checkpoints/    step-NNNNNNN/ folders; complete only when their DONE manifest exists and verifies
  tb/             TensorBoard event files (trainer)
  report.png      the latest plot made by report_metrics

Every file is opened through vapo_engine.datafiles: regular files only, never through a symlink (a run directory
is data; whoever can write it may plant links or FIFOs). Torch-free: the run manager, the tools and the diagnostics read runs through this module; the trainer writes
its checkpoints' tensors itself and then calls `write_manifest` here.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from . import datafiles, proclocks
from .errors import StorageError, UserError

RUN_JSON, CONFIG_JSON, SETTINGS_JSON = "run.json", "config.json", "settings.json"
STATE_JSON, SUMMARY_JSON, METRICS = "state.json", "summary.json", "metrics.jsonl"
WORKER_LOG, RUNNER_LOG, WORKER_LOCK, WORKER_JSON = "worker.log", "runner.log", "worker.lock", "worker.json"
RUNNER_LOCK = "runner.lock"
TRAINER_MODULE, RUNNER_MODULE = "vapo_engine.trainer", "vapo_engine.jobs.runner"
PROVIDER_JSON, PROVIDER_CACHE = "provider.json", "provider_cache.jsonl"
"""Provider samples (trainer/provider_samples.py): why the provider stopped being used; the answers cache."""
ROLLOUT_JSON, ROLLOUT_WEIGHTS = "rollout.json", "rollout_weights"
"""Remote rollouts (trainer/weight_sync.py): whether the trainer waits for its inference servers (or gave up on
them), and where it writes the weights it pushes to them (unless rollout.weights_dir says elsewhere)."""
CHECKPOINTS, DONE, TB, REPORT_PNG = "checkpoints", "DONE", "tb", "report.png"
VALUE_MODEL, WANDB = "value_model", "wandb"
SUBFOLDERS = (CHECKPOINTS, TB, ROLLOUT_WEIGHTS, VALUE_MODEL, WANDB)
"""The folders the trainer and its sinks write inside a run directory: never through a symlink (`linked_subfolders`)."""
HASH_LIMIT = 64 * 1024 * 1024  # files up to this size are hashed in the manifest; larger ones: size + structure


class RunDirBusy(UserError):
    """Another live process holds the run directory's writer lock."""


class LinkedSubfolder(UserError):
    """A folder the trainer writes in the run directory (or a checkpoint in it) is a symlink."""


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:07d}"

    # --- JSON files ------------------------------------------------------------------------------------------
    def read_json(self, name: str) -> dict | None:
        """The parsed file, or None when it is missing or unreadable (never raises)."""
        try:
            data = json.loads(datafiles.read_text(self.file(name)))
        except (OSError, ValueError, RecursionError):  # missing, a link or FIFO, torn, not UTF-8, nested too deep
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, obj) -> None:
        write_json_atomic(self.file(name), obj)

    def meta(self) -> dict:
        return self.read_json(RUN_JSON) or {}

    def summary(self) -> dict:
        return self.read_json(SUMMARY_JSON) or {}

    def config(self) -> dict:
        return self.read_json(CONFIG_JSON) or {}

    def metrics(self) -> list[dict]:
        """Every record of metrics.jsonl, in order (a torn last line is skipped)."""
        from .metrics import read_metrics
        return read_metrics(self.file(METRICS))

    def is_run(self) -> bool:
        return self.file(RUN_JSON).is_file()

    def log_tail(self, lines: int = 20, max_chars: int = 4000, name: str = WORKER_LOG,
                 max_bytes: int = 64 * 1024, start: int = 0) -> str:
        return log_tail(self.file(name), lines, max_chars, max_bytes, start)

    def log_size(self, name: str = WORKER_LOG) -> int:
        try:
            return self.file(name).stat().st_size
        except OSError:
            return 0

    def mtime(self, name: str) -> float | None:
        try:
            return self.file(name).stat().st_mtime
        except OSError:
            return None

    # --- attempts (the registry's records, mirrored) -----------------------------------------------------------
    def attempts(self) -> dict[str, dict]:
        return dict((self.read_json(STATE_JSON) or {}).get("attempts") or {})

    def record_attempt(self, run_id: str, fields: dict) -> None:
        """Merge `fields` into this attempt's record in state.json (under a lock: several processes write)."""
        try:
            with _flocked(self.path / ".state.lock"):
                attempts = self.attempts()
                attempts[run_id] = {**attempts.get(run_id, {}), **fields}
                self.write_json(STATE_JSON, {"attempts": attempts})
        except OSError as e:
            raise storage_error(self.file(STATE_JSON), e) from None

    # --- checkpoints -------------------------------------------------------------------------------------------
    def linked_subfolders(self) -> list[Path]:
        """`SUBFOLDERS` and entries of checkpoints/ that are symlinks: the trainer's writes would land wherever
        they point (whoever can write the run directory chooses that), and a linked checkpoint is not this
        run's."""
        links = [p for p in map(self.file, SUBFOLDERS) if p.is_symlink()]
        if self.checkpoints.is_dir() and not self.checkpoints.is_symlink():
            try:
                links += sorted(p for p in self.checkpoints.iterdir() if p.is_symlink())
            except OSError:
                pass
        return links

    def refuse_linked_subfolders(self) -> None:
        """`LinkedSubfolder` naming every linked folder and the fix (before a run starts or resumes)."""
        if links := self.linked_subfolders():
            raise LinkedSubfolder(f"run directory {self.path} has symbolic links where the trainer writes: "
                                  + ", ".join(str(p) for p in links[:10]) + "; the trainer never writes through a "
                                  "link: replace each with a real folder (or remove it), then start or resume again")

    def checkpoint_dirs(self) -> list[Path]:
        """Folders that carry a DONE marker, oldest first (not yet verified)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.glob("step-*") if step_of(p) is not None
                      and (p / DONE).is_file())

    def usable_checkpoints(self) -> tuple[list[Path], list[tuple[Path, str]]]:
        """(verified checkpoints newest first, [(damaged checkpoint, why)] newest first)."""
        ok, broken = [], []
        for p in reversed(self.checkpoint_dirs()):
            why = verify_checkpoint(p)
            (broken.append((p, why)) if why else ok.append(p))
        return ok, broken

    def latest_checkpoint_step(self) -> int | None:
        ok, _ = self.usable_checkpoints()
        return step_of(ok[0]) if ok else None

    # --- the writer lock ---------------------------------------------------------------------------------------
    def writer(self) -> dict | None:
        """The live writer while worker.lock is held, else None: {"pid", "pgid"} of the trainer holding it as
        the kernel reports it (`proclocks`; both None when that cannot be told), with worker.json's host and
        start time for display. Only that pid/pgid is ever signalled."""
        if not _held(self.file(WORKER_LOCK)):
            return None
        shown = {k: v for k, v in (self.read_json(WORKER_JSON) or {}).items() if k in ("host", "started")}
        found = proclocks.holder(self.file(WORKER_LOCK), TRAINER_MODULE, run_dir=self.path)
        return {**shown, **(found or {"pid": None, "pgid": None})}

    def supervisor(self, run_id: str) -> dict | None:
        """{"pid", "pgid"} of the live supervisor of attempt `run_id` (holding runner.lock), else None."""
        return proclocks.holder(self.file(RUNNER_LOCK), RUNNER_MODULE, arg=run_id)

    def acquire_supervisor(self) -> WriterLock:
        """Hold runner.lock for the life of this process (the supervisor); `RunDirBusy` when another holds it."""
        lock = WriterLock(self, RUNNER_LOCK, info=False)
        lock.acquire(0.0)
        return lock

    def acquire_writer(self, timeout: float = 10.0) -> WriterLock:
        """Become the one writer of this run directory, or raise `RunDirBusy` naming the holder."""
        lock = WriterLock(self)
        lock.acquire(timeout)
        return lock


class WriterLock:
    """An exclusive flock on worker.lock (or runner.lock) held for the life of the process (the kernel releases
    it when the process dies, however it dies), with worker.json saying who holds it."""

    def __init__(self, rd: RunDir, name: str = WORKER_LOCK, info: bool = True):
        self.rd, self.name, self.info, self.fd = rd, name, info, None

    def acquire(self, timeout: float) -> None:
        fd = os.open(self.rd.file(self.name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    who = "worker" if self.name == WORKER_LOCK else "supervisor"
                    pid = proclocks.lock_holder(self.rd.file(self.name))  # the kernel's answer, not worker.json
                    raise RunDirBusy(f"another {who} (pid {pid or '?'}) is writing run directory {self.rd.path} "
                                     f"(it holds {self.name}); stop it first (stop_run / vapo-mcp runs stop) or "
                                     "wait for it to finish") from None
                time.sleep(0.1)
        self.fd = fd
        if self.info:
            self.rd.write_json(WORKER_JSON, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _held(path: Path) -> bool:
    """Whether some process holds an flock on `path` (a symlink counts as not held: it is never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
    finally:
        os.close(fd)
    return False


# --- checkpoint manifests ----------------------------------------------------------------------------------------
def write_manifest(folder: Path, step: int) -> None:
    """Write the DONE marker *last*: a JSON manifest of every file in `folder` (size, and sha256 when small)."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != DONE:
            size = p.stat().st_size
            entry = {"size": size}
            if size <= HASH_LIMIT:
                entry["sha256"] = _sha256(p)
            files[p.relative_to(folder).as_posix()] = entry
    _write_synced(folder / DONE, json.dumps({"step": step, "files": files}, indent=1))


def verify_checkpoint(folder: Path) -> str | None:
    """None when the checkpoint is complete and intact, else why not (missing, truncated, altered or
    unreadable file). Never raises: a checkpoint that cannot be checked is not usable."""
    try:
        return _verify(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return f"unreadable ({type(e).__name__}: {str(e)[:120]})"


def _verify(folder: Path) -> str | None:
    try:
        manifest = json.loads(datafiles.read_text(folder / DONE))
    except (OSError, ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return "the DONE manifest is damaged (no file table)"
    for rel, entry in manifest["files"].items():
        if not isinstance(entry, dict) or ".." in Path(rel).parts or Path(rel).is_absolute():
            return f"the DONE manifest is damaged (entry {rel!r})"
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != entry.get("size"):
            return f"{rel} has {size} bytes, {entry.get('size')} were written"
        if "sha256" in entry and _sha256(p) != entry["sha256"]:
            return f"{rel} was altered after it was written (checksum differs)"
    return _verify_structure(folder)


def _verify_structure(folder: Path) -> str | None:
    for p in sorted(folder.rglob("*.safetensors")):
        why = safetensors_problem(p)
        if why:
            return f"{p.relative_to(folder).as_posix()}: {why}"
    if not any(folder.glob("policy/*.safetensors")):
        return "policy weights (policy/*.safetensors) are missing"
    return None


def safetensors_problem(path: Path) -> str | None:
    """None when the file's header parses and its size matches the tensors it declares."""
    try:
        size = path.stat().st_size
        with datafiles.open_read(path) as f:  # a FIFO named *.safetensors must not block the caller
            raw = f.read(8)
            if len(raw) < 8:
                return "truncated (no header)"
            (n,) = struct.unpack("<Q", raw)
            if n > min(size, 100_000_000):
                return "damaged header"
            header = json.loads(f.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        return f"unreadable ({type(e).__name__})"
    expected = 8 + n + max(ends, default=0)
    return None if size == expected else f"truncated or padded ({size} bytes, the header declares {expected})"


# --- small shared helpers ----------------------------------------------------------------------------------------
def write_json_atomic(path: Path, obj) -> None:
    """Write JSON so that readers see the old or the new file, never half of one: through a randomly named
    temporary file in the same folder, never written through a planted link (vapo_engine.datafiles)."""
    try:
        datafiles.write_atomic(path, json.dumps(obj, indent=2, default=str))
    except OSError as e:
        raise storage_error(path, e) from None


def storage_error(path: Path, e: OSError) -> StorageError:
    """An OS error on a run file as a message with the fix."""
    why = e.strerror or type(e).__name__
    return StorageError(f"cannot write {path} ({why}); make its folder writable (or free disk space), or set "
                        "runtime.log_dir in settings.json to a writable folder")


def log_tail(path: Path, lines: int = 20, max_chars: int = 4000, max_bytes: int = 64 * 1024,
             start: int = 0) -> str:
    """The last `lines` lines of a text file (at most `max_chars`, read from its last `max_bytes`, never
    before byte `start`: an attempt's own output in a log that earlier attempts wrote to). A symlink, FIFO or
    anything but a regular file reads as empty (vapo_engine.datafiles)."""
    try:
        with datafiles.open_read(path) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, start, f.tell() - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])[-max_chars:]


def step_of(p: Path) -> int | None:
    tail = p.name.partition("-")[2]
    return int(tail) if p.name.startswith("step-") and tail.isdigit() else None


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with datafiles.open_read(p) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_synced(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _flocked(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
