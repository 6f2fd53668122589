"""The run registry: one SQLite database under runtime.log_dir, safe for several processes at once.

WAL journal + busy timeout; every state change is a conditional UPDATE (from an allowed state only), so two
servers or a server and a runner never overwrite each other's decisions. Torch-free.
"""
from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .states import ALLOWED, MESSAGES, State

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, tags TEXT NOT NULL, run_dir TEXT NOT NULL,
  state TEXT NOT NULL, message TEXT NOT NULL, created REAL NOT NULL, started REAL, finished REAL,
  heartbeat REAL, pid INTEGER, exit_code INTEGER, resumed_from TEXT, group_id TEXT, variant TEXT,
  resume INTEGER NOT NULL DEFAULT 0, nprocs INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE INDEX IF NOT EXISTS runs_group ON runs(group_id);
"""


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


class Registry:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "runs.sqlite3"
        with self._conn() as c:
            c.executescript(SCHEMA)

    @contextmanager
    def _conn(self, immediate: bool = False):
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            if immediate:
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if immediate:
                conn.execute("COMMIT")
        except BaseException:
            if immediate and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def add(self, run_id: str, experiment: str, tags, run_dir: Path, *, resumed_from: str | None = None,
            group_id: str | None = None, variant: str | None = None, resume: bool = False,
            nprocs: int = 1) -> RunRecord:
        with self._conn() as c:
            c.execute("INSERT INTO runs (run_id, experiment, tags, run_dir, state, message, created, resumed_from,"
                      " group_id, variant, resume, nprocs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                      (run_id, experiment, json.dumps(list(tags)), str(run_dir), State.QUEUED.value,
                       MESSAGES[State.QUEUED], time.time(), resumed_from, group_id, variant, int(resume), nprocs))
        return self.get(run_id)

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
        return cur.rowcount == 1

    def update(self, run_id: str, **fields) -> None:
        """Non-state fields (heartbeat, pid, message of a running run)."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._conn() as c:
            c.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*fields.values(), run_id])

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
        return [self.get(r["run_id"]) for r in rows]


def _record(row: sqlite3.Row) -> RunRecord:
    d = dict(row)
    return RunRecord(d["run_id"], d["experiment"], tuple(json.loads(d["tags"])), Path(d["run_dir"]),
                     State(d["state"]), d["message"], d["created"], d["started"], d["finished"], d["heartbeat"],
                     d["pid"], d["exit_code"], d["resumed_from"], d["group_id"], d["variant"], bool(d["resume"]),
                     d["nprocs"])
