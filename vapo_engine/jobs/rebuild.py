"""Registry records recovered from a run directory, for rebuilding a lost or damaged registry. Torch-free.

A run directory keeps every attempt's record in state.json (mirrored by the registry on each change). Run
directories from before that mirror have only run.json and, when the worker finished, summary.json: their
one record is derived from those (and from the writer lock, when a worker is still writing).
"""
from __future__ import annotations

import json
import time

from vapo_engine.rundir import SUMMARY_JSON, RunDir

from .outcome import final_state
from .states import State

REBUILT = "found in its run directory when the run registry was rebuilt"


def records_from_run_dir(rd: RunDir) -> list[dict]:
    """Registry rows (column → value) for every attempt the run directory knows of."""
    attempts = rd.attempts()
    if attempts:
        return [_row(rd, run_id, rec) for run_id, rec in attempts.items() if isinstance(rec, dict)]
    meta = rd.meta()
    if not meta.get("run_id"):
        return []
    return [_derived(rd, meta)]


def _row(rd: RunDir, run_id: str, rec: dict) -> dict:
    state = rec.get("state") if rec.get("state") in {s.value for s in State} else State.FAILED.value
    return {"run_id": run_id, "experiment": rec.get("experiment") or rd.meta().get("experiment", "?"),
            "tags": json.dumps(list(rec.get("tags") or [])), "run_dir": str(rd.path), "state": state,
            "message": rec.get("message") or REBUILT, "created": rec.get("created") or time.time(),
            "started": rec.get("started"), "finished": rec.get("finished"),
            "heartbeat": time.time() if state == State.RUNNING.value else rec.get("started"),
            "pid": rec.get("pid"), "exit_code": rec.get("exit_code"), "resumed_from": rec.get("resumed_from"),
            "group_id": rec.get("group_id"), "variant": rec.get("variant"), "resume": int(bool(rec.get("resume"))),
            "nprocs": int(rec.get("nprocs") or 1)}


def _derived(rd: RunDir, meta: dict) -> dict:
    """One record from run.json + summary.json (+ the writer lock) for a directory without state.json."""
    created = float(meta.get("created") or time.time())
    if rd.writer():
        state, message = State.RUNNING, f"{REBUILT}; its worker is still training"
    else:
        state, message = final_state(rd, None, stopped=False)
        message = f"{REBUILT}; {message}"
    rec = {"state": state.value, "message": message, "created": created, "started": created,
           "finished": None if state is State.RUNNING else rd.mtime(SUMMARY_JSON) or time.time(),
           "experiment": meta.get("experiment"), "tags": meta.get("tags") or [],
           "group_id": meta.get("group_id"), "variant": meta.get("variant")}
    return _row(rd, str(meta["run_id"]), rec)
