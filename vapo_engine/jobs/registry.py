"""The run registry: an index (SQLite, under runtime.log_dir) over the run directories, safe for several
processes at once.

WAL journal + busy timeout; every state change is a conditional UPDATE (from an allowed state only), so two
servers or a server and a runner never overwrite each other's decisions. The run directories are the source
of truth: every record change is mirrored into `<run dir>/state.json`, and a missing or unreadable database is
rebuilt from them (a damaged one is first moved aside). OS and SQLite failures become `StorageError`s that
name the path and the fix. Torch-free.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vapo_engine.errors import StorageError, UserError
from vapo_engine.rundir import RunDir

from .rebuild import index_run_dirs
from .states import ALLOWED, MESSAGES, State

log = logging.getLogger("vapo_mcp.registry")


class RunIdTaken(UserError):
    """A run id that the registry already holds."""


class QueueFull(UserError):
    """As many runs as `runtime.max_queued_runs` already wait."""
DB_NAME = "runs.sqlite3"
_ATTEMPT = re.compile(r"(.+)-r[0-9]+")
COLUMNS = ("run_id", "experiment", "tags", "run_dir", "state", "message", "created", "started", "finished",
           "heartbeat", "pid", "exit_code", "resumed_from", "group_id", "variant", "resume", "nprocs")
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, tags TEXT NOT NULL, run_dir TEXT NOT NULL,
  state TEXT NOT NULL, message TEXT NOT NULL, created REAL NOT NULL, started REAL, finished REAL,
  heartbeat REAL, pid INTEGER, exit_code INTEGER, resumed_from TEXT, group_id TEXT, variant TEXT,
  resume INTEGER NOT NULL DEFAULT 0, nprocs INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE INDEX IF NOT EXISTS runs_group ON runs(group_id);
CREATE TABLE IF NOT EXISTS skipped (run_dir TEXT PRIMARY KEY, reason TEXT NOT NULL, seen REAL NOT NULL);
"""
"""`skipped`: run directories (or their attempt records) a rebuild could not index, and why."""


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    experiment: str
    tags: tuple[str, ...]
    run_dir: Path
    state: State
    message: str
    created: float
    started: float | None
    finished: float | None
    heartbeat: float | None
    pid: int | None
    exit_code: int | None
    resumed_from: str | None
    group_id: str | None
    variant: str | None
    resume: bool
    nprocs: int

    def public(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(state=self.state.value, run_dir=str(self.run_dir), tags=list(self.tags))
        return d

    def mirror(self) -> dict:
        """What state.json keeps of this record (everything but the heartbeat)."""
        d = self.public()
        d.pop("heartbeat")
        return d


class Registry:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.path = self.root / DB_NAME
        self._rebuilding = False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the runs folder {self.root} ({e.strerror or e}); set "
                               "runtime.log_dir in settings.json to a writable folder") from None
        self._ensure()

    # --- connection, schema, rebuild --------------------------------------------------------------------------
    def _ensure(self) -> None:
        """Create the database when it is missing (rebuilding it from the run directories); move a damaged
        one aside and rebuild."""
        self._rebuilding = True
        try:
            if self.path.is_file() and self._usable():
                with self._conn() as c:
                    c.executescript(SCHEMA)  # a registry from before a table was added gets it
                return
            for stale in (self.path.with_name(DB_NAME + "-wal"), self.path.with_name(DB_NAME + "-shm")):
                if not self.path.exists() and stale.exists():  # a journal of a deleted database must not replay
                    self._guard(stale.unlink)
            with self._conn() as c:
                c.executescript(SCHEMA)
            self.rebuild()
        finally:
            self._rebuilding = False

    def _usable(self) -> bool:
        """True when the database answers; False when it lacks the table or was moved aside as damaged."""
        try:
            with self._raw() as c:
                c.execute("SELECT COUNT(*) FROM runs").fetchone()
                columns = {row[1] for row in c.execute("PRAGMA table_info(runs)")}
        except sqlite3.DatabaseError as e:
            damaged = type(e) is sqlite3.DatabaseError or "malformed" in str(e) or "not a database" in str(e)
            if "no such table" in str(e):
                return False
            if not damaged:
                raise StorageError(f"the run registry {self.path} cannot be used ({e}); make it and its folder "
                                   "writable (chmod u+w), or set runtime.log_dir in settings.json to a writable "
                                   "folder") from None
            return self._move_aside("damaged", str(e))
        if not set(COLUMNS) <= columns:
            return self._move_aside("wrong-schema", f"its runs table lacks {sorted(set(COLUMNS) - columns)}")
        return True

    def _move_aside(self, why: str, detail: str) -> bool:
        aside = self.path.with_name(f"{DB_NAME}.{why}-{int(time.time())}")
        log.warning("run registry %s is %s (%s); moved to %s and rebuilt", self.path, why, detail, aside)
        for name in (DB_NAME + "-wal", DB_NAME + "-shm"):
            if self.path.with_name(name).exists():
                self._guard(self.path.with_name(name).unlink)
        self._guard(lambda: os.replace(self.path, aside))
        return False

    def rebuild(self) -> int:
        """Index every run directory under the root that the database does not know yet; returns how many
        records were added. A record that cannot be read, or that claims an id which is not its directory's
        (or that another directory claims too), is skipped and listed in `skipped()`; every other run stays."""
        rows, problems = index_run_dirs(self.root)
        added = 0
        with self._conn(immediate=True) as c:
            for rec in rows:
                cur = c.execute(f"INSERT OR IGNORE INTO runs ({', '.join(COLUMNS)}) VALUES "
                                f"({','.join('?' * len(COLUMNS))})", [rec.get(k) for k in COLUMNS])
                added += cur.rowcount
            c.execute("DELETE FROM skipped")
            c.executemany("INSERT OR REPLACE INTO skipped (run_dir, reason, seen) VALUES (?,?,?)",
                          [(d, why, time.time()) for d, why in problems.items()])
        if added or problems:
            log.warning("run registry %s: %d run record(s) rebuilt from the run directories, %d skipped",
                        self.path, added, len(problems))
        return added

    def skipped(self) -> dict[str, str]:
        """Run directory (or attempt) → why the last rebuild could not index it."""
        with self._conn() as c:
            return {r["run_dir"]: r["reason"] for r in c.execute("SELECT run_dir, reason FROM skipped")}

    @contextmanager
    def _raw(self):
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _conn(self, immediate: bool = False):
        if not self.path.exists() and not self._rebuilding:
            self._ensure()  # the file was deleted under us: recreate it and re-index the run directories
        try:
            with self._raw() as conn:
                if immediate:
                    conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    if immediate:
                        conn.execute("COMMIT")
                except BaseException:
                    if immediate and conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise StorageError(f"the run registry {self.path} cannot be used ({e}); make it and its folder "
                               "writable (chmod u+w), or delete it — it is rebuilt from the run directories — "
                               "or set runtime.log_dir in settings.json to a writable folder") from None
        except OSError as e:
            raise StorageError(f"cannot open the run registry {self.path} ({e.strerror or e}); make the folder "
                               "writable or set runtime.log_dir in settings.json to a writable folder") from None

    def _guard(self, fn) -> None:
        try:
            fn()
        except OSError as e:
            raise StorageError(f"cannot repair the run registry {self.path} ({e.strerror or e}); make the folder "
                               "writable or set runtime.log_dir in settings.json to a writable folder") from None

    def _mirror(self, run_id: str) -> None:
        """Copy the record into its run directory's state.json (a failure there is logged, never fatal: the
        database already holds the change)."""
        rec = self.get(run_id)
        if rec is None:
            return
        try:
            RunDir(rec.run_dir).record_attempt(run_id, rec.mirror())
        except (StorageError, OSError) as e:
            log.warning("could not mirror run %s into %s: %s", run_id, rec.run_dir, e)

    # --- records -----------------------------------------------------------------------------------------------
    def add(self, run_id: str, experiment: str, tags, run_dir: Path, *, resumed_from: str | None = None,
            group_id: str | None = None, variant: str | None = None, resume: bool = False,
            nprocs: int = 1, max_queued: int | None = None, family: str | None = None) -> RunRecord:
        """Queue a new record, in one transaction with its checks: with `max_queued`, `QueueFull` when that many
        runs already wait; with `family` (a run's first id), the family's queued or running attempt is returned
        instead of a new one (a second resume_run gets the attempt the first one made)."""
        with self._conn(immediate=True) as c:
            live = _live_attempt(c, family) if family else None
            if live is None:
                queued = c.execute("SELECT COUNT(*) FROM runs WHERE state = ?", (State.QUEUED.value,)).fetchone()[0]
                if max_queued is not None and queued >= max_queued:
                    raise queue_full(queued, max_queued)
                cur = c.execute("INSERT OR IGNORE INTO runs (run_id, experiment, tags, run_dir, state, message, "
                                "created, resumed_from, group_id, variant, resume, nprocs) VALUES "
                                "(?,?,?,?,?,?,?,?,?,?,?,?)",
                                (run_id, experiment, json.dumps(list(tags)), str(run_dir), State.QUEUED.value,
                                 MESSAGES[State.QUEUED], time.time(), resumed_from, group_id, variant, int(resume),
                                 nprocs))
        if live is not None:
            return self.get(live)
        if cur.rowcount != 1:
            raise RunIdTaken(f"run id {run_id!r} is already registered; pick another run id")
        self._mirror(run_id)
        return self.get(run_id)

    def queued(self) -> int:
        with self._conn() as c:
            return c.execute("SELECT COUNT(*) FROM runs WHERE state = ?", (State.QUEUED.value,)).fetchone()[0]

    def get(self, run_id: str) -> RunRecord | None:
        with self._conn() as c:
            row = c.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return _record(row) if row else None

    def list(self, *, state: str | None = None, experiment: str | None = None, tag: str | None = None,
             group_id: str | None = None, limit: int = 50) -> list[RunRecord]:
        q, args = "SELECT * FROM runs WHERE 1=1", []
        for col, val in (("state", state), ("experiment", experiment), ("group_id", group_id)):
            if val:
                q += f" AND {col} = ?"
                args.append(val)
        with self._conn() as c:
            rows = c.execute(q + " ORDER BY created DESC", args).fetchall()
        recs = [_record(r) for r in rows]
        return [r for r in recs if not tag or tag in r.tags][:limit]

    def transition(self, run_id: str, new: State, message: str | None = None, **fields) -> bool:
        """Move to `new` only from an allowed state; returns False (and changes nothing) otherwise."""
        allowed_from = [s.value for s, targets in ALLOWED.items() if new in targets]
        now = time.time()
        extra = {"started": now} if new is State.RUNNING else {"finished": now} if new.terminal else {}
        extra.update(fields)
        sets = ", ".join(["state = ?", "message = ?", *(f"{k} = ?" for k in extra)])
        q = f"UPDATE runs SET {sets} WHERE run_id = ? AND state IN ({','.join('?' * len(allowed_from))})"
        with self._conn() as c:
            cur = c.execute(q, [new.value, message or MESSAGES[new], *extra.values(), run_id, *allowed_from])
        if cur.rowcount == 1:
            self._mirror(run_id)
        return cur.rowcount == 1

    def update(self, run_id: str, **fields) -> None:
        """Non-state fields (heartbeat, pid, message of a running run)."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._conn() as c:
            c.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*fields.values(), run_id])
        if set(fields) - {"heartbeat"}:
            self._mirror(run_id)

    def claim_queued(self, max_concurrent: int) -> list[RunRecord]:
        """Atomically mark as many queued runs running as there are free slots; return them (oldest first)."""
        with self._conn(immediate=True) as c:
            running = c.execute("SELECT COUNT(*) FROM runs WHERE state = ?", (State.RUNNING.value,)).fetchone()[0]
            free = max(0, max_concurrent - running)
            rows = c.execute("SELECT run_id FROM runs WHERE state = ? ORDER BY created LIMIT ?",
                             (State.QUEUED.value, free)).fetchall()
            now = time.time()
            for r in rows:
                c.execute("UPDATE runs SET state = ?, message = ?, started = ?, heartbeat = ? WHERE run_id = ?",
                          (State.RUNNING.value, "starting the worker", now, now, r["run_id"]))
        for r in rows:
            self._mirror(r["run_id"])
        return [self.get(r["run_id"]) for r in rows]


def queue_full(queued: int, max_queued: int, asked: int = 1) -> QueueFull:
    what = "a run" if asked == 1 else f"{asked} runs"
    return QueueFull(f"{queued} runs are already queued and runtime.max_queued_runs is {max_queued}, so {what} "
                     "cannot be queued now; wait for queued runs to start, stop some (list_runs(state='queued'), "
                     "then stop_run), or raise runtime.max_queued_runs in settings.json")


def family_of(run_id: str) -> str:
    """The first id of a run: `R` for `R`, `R-r1`, `R-r2`, …"""
    m = _ATTEMPT.fullmatch(run_id)
    return m.group(1) if m else run_id


def _live_attempt(c: sqlite3.Connection, family: str) -> str | None:
    rows = c.execute("SELECT run_id FROM runs WHERE (run_id = ? OR run_id LIKE ?) AND state IN (?, ?) "
                     "ORDER BY created DESC", (family, family + "-r%", State.QUEUED.value,
                                               State.RUNNING.value)).fetchall()
    return next((r["run_id"] for r in rows if family_of(r["run_id"]) == family), None)


def _record(row: sqlite3.Row) -> RunRecord:
    d = dict(row)
    return RunRecord(d["run_id"], d["experiment"], tuple(json.loads(d["tags"])), Path(d["run_dir"]),
                     State(d["state"]), d["message"], d["created"], d["started"], d["finished"], d["heartbeat"],
                     d["pid"], d["exit_code"], d["resumed_from"], d["group_id"], d["variant"], bool(d["resume"]),
                     d["nprocs"])
