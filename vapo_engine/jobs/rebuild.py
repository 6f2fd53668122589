"""Registry records recovered from the run directories, for rebuilding a lost or damaged registry. Torch-free.

A run directory keeps every attempt's record in state.json (mirrored by the registry on each change). Run
directories from before that mirror have only run.json and, when the worker finished, summary.json: their
one record is derived from those (and from the writer lock, when a worker is still writing).

Run directories are data, never authority (docs/security.md "A run directory is data, never authority"): whoever can write one chooses what its files say. So a
record is indexed only when it is well-formed (every field of the right type) and claims its own directory's
id — the directory `<experiment>/<R>/` may hold attempts `R`, `R-r1`, `R-r2`, … and nothing else — and only
when no other directory claims that id too. Anything else is skipped with a reason (`index_run_dirs`), so
one bad record costs its own run, never the registry.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vapo_engine.rundir import RUN_JSON, SUMMARY_JSON, RunDir

from .outcome import final_state
from .states import State

REBUILT = "found in its run directory when the run registry was rebuilt"
FIX = "repair or remove that file, then delete runs.sqlite3 (it is rebuilt from the run directories)"


class RecordError(ValueError):
    """A record in a run directory that cannot be indexed (the message says which field and why)."""


def index_run_dirs(root: Path) -> tuple[list[dict], dict[str, str]]:
    """(registry rows of every indexable record under `root`, {run dir or attempt: why it was skipped})."""
    claims: dict[str, list[dict]] = {}
    problems: dict[str, str] = {}
    for meta in sorted(root.glob(f"*/*/{RUN_JSON}")):
        rd = RunDir(meta.parent)
        try:
            rows, bad = records_from_run_dir(rd)
        except (RecordError, OSError) as e:
            problems[str(rd.path)] = f"{e}; {FIX}"
            continue
        problems.update(bad)
        for row in rows:
            claims.setdefault(row["run_id"], []).append(row)
    rows = []
    for run_id, rows_of_id in claims.items():
        if len(rows_of_id) == 1:
            rows.append(rows_of_id[0])
            continue
        where = ", ".join(r["run_dir"] for r in rows_of_id)
        for r in rows_of_id:
            problems[f"{r['run_dir']} ({run_id})"] = (f"run id {run_id!r} is claimed by {len(rows_of_id)} run "
                                                      f"directories ({where}); remove the one that is not the run, "
                                                      "then delete runs.sqlite3")
    return rows, problems


def records_from_run_dir(rd: RunDir) -> tuple[list[dict], dict[str, str]]:
    """(registry rows for every well-formed attempt the run directory knows of, {attempt: why skipped})."""
    attempts = (rd.read_json("state.json") or {}).get("attempts")
    if isinstance(attempts, dict) and attempts:
        rows, bad = [], {}
        for run_id, rec in attempts.items():
            try:
                rows.append(_row(rd, _own_id(rd, run_id, "state.json"), _fields(rec, f"state.json attempt {run_id!r}")))
            except RecordError as e:
                bad[f"{rd.path} ({str(run_id)[:80]})"] = f"{e}; {FIX}"
        return rows, bad
    meta = rd.meta()
    if not meta.get("run_id"):
        raise RecordError("run.json has no run_id (and there is no state.json)")
    return [_derived(rd, meta)], {}


def _own_id(rd: RunDir, run_id: Any, where: str) -> str:
    """`run_id` when it is this directory's own id or one of its attempts' (`<dir>-r<n>`)."""
    name = rd.path.name
    rest = run_id[len(name):] if isinstance(run_id, str) and run_id.startswith(name) else None
    if rest == "" or (rest and rest[:2] == "-r" and rest[2:].isascii() and rest[2:].isdigit()):
        return run_id
    raise RecordError(f"{where} claims run id {str(run_id)[:80]!r}, which is not this directory's "
                      f"({name!r} or {name}-r<n>)")


def _fields(rec: Any, where: str) -> dict:
    """An attempt's record, each field checked (a number, an integer, a string or a list of strings)."""
    if not isinstance(rec, dict):
        raise RecordError(f"{where} is not an object")
    out = {k: _typed(rec.get(k), kind, f"{where}: {k}") for k, kind in _KINDS.items()}
    out["tags"] = out["tags"] or []
    return out


_KINDS = {"experiment": str, "tags": list, "message": str, "created": float, "started": float, "finished": float,
          "pid": int, "exit_code": int, "resumed_from": str, "group_id": str, "variant": str, "resume": bool,
          "nprocs": int, "state": str}


def _typed(value: Any, kind: type, where: str) -> Any:
    if value is None:
        return None
    ok = {float: isinstance(value, (int, float)) and not isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool), str: isinstance(value, str),
          bool: isinstance(value, (bool, int)),
          list: isinstance(value, list) and all(isinstance(t, str) for t in value)}[kind]
    if not ok:
        want = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
                list: "a list of strings"}[kind]
        raise RecordError(f"{where} is {json.dumps(value, default=str)[:60]}, not {want}")
    return value


def _row(rd: RunDir, run_id: str, rec: dict) -> dict:
    state = rec.get("state") if rec.get("state") in {s.value for s in State} else State.FAILED.value
    nprocs = rec.get("nprocs") or 1
    if nprocs < 1:
        raise RecordError(f"attempt {run_id!r}: nprocs is {nprocs}, not a positive integer")
    return {"run_id": run_id, "experiment": rec.get("experiment") or str(rd.meta().get("experiment", "?")),
            "tags": json.dumps(list(rec.get("tags") or [])), "run_dir": str(rd.path), "state": state,
            "message": rec.get("message") or REBUILT, "created": rec.get("created") or time.time(),
            "started": rec.get("started"), "finished": rec.get("finished"),
            "heartbeat": time.time() if state == State.RUNNING.value else rec.get("started"),
            "pid": rec.get("pid"), "exit_code": rec.get("exit_code"), "resumed_from": rec.get("resumed_from"),
            "group_id": rec.get("group_id"), "variant": rec.get("variant"), "resume": int(bool(rec.get("resume"))),
            "nprocs": nprocs}


def _derived(rd: RunDir, meta: dict) -> dict:
    """One record from run.json + summary.json (+ the writer lock) for a directory without state.json."""
    run_id = _own_id(rd, meta["run_id"], "run.json")
    fields = _fields({k: meta.get(k) for k in ("created", "experiment", "tags", "group_id", "variant")}, "run.json")
    created = fields["created"] or time.time()
    if rd.writer():
        state, message = State.RUNNING, f"{REBUILT}; its worker is still training"
    else:
        state, message = final_state(rd, None, stopped=False)
        message = f"{REBUILT}; {message}"
    rec = {**fields, "state": state.value, "message": message, "created": created, "started": created,
           "finished": None if state is State.RUNNING else rd.mtime(SUMMARY_JSON) or time.time()}
    return _row(rd, run_id, rec)
