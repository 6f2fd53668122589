"""Runs seen as MCP tasks (server/tasks.py serves them): a run id — or an ablation id, for the runs of an ablation —
is a task id, so a task lives as long as its run directory and any server process can answer for it. Plain functions
over the read model of runs (tools.training.views_for → vapo_engine.jobs.views); no mcp, no torch.

    run state   queued / running → working;  succeeded → completed;  stopped → cancelled;  failed → failed
    ablation    working while a run of it is not finished; cancelled when one was stopped; else completed

A task's message says where it is: its state, step / total steps, the latest held-out accuracy and the record's
message. Its outcome is the run's final summary: run_status' content (scrubbed, confined like the run resources)
plus summary.json; for an ablation, report_metrics' comparison table.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel

from vapo_engine.jobs import RunSnapshot
from vapo_engine.providers.redaction import scrub_obj

from . import run_resources, training
from .paths import Files, ToolInputError, known_secrets
from .report import report_metrics

Status = Literal["working", "completed", "failed", "cancelled"]
STATUS = {"queued": "working", "running": "working", "succeeded": "completed", "stopped": "cancelled",
          "failed": "failed"}
ABLATION_PREFIX = "abl-"
MAX_RUNS = 100


class TaskView(BaseModel):
    task_id: str
    status: Status
    message: str
    created_at: str
    updated_at: str

    @property
    def terminal(self) -> bool:
        return self.status != "working"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _progress(snap: RunSnapshot) -> str:
    rec = snap.record
    parts = [rec.state.value, f"step {snap.step}/{snap.total_steps if snap.total_steps is not None else '?'}"]
    acc = snap.latest_eval.get("eval/greedy_accuracy")
    if acc is not None:
        parts.append(f"held-out accuracy {acc:.3f} at step {snap.latest.get('eval', {}).get('step', '?')}")
    if rec.message:
        parts.append(rec.message)
    return "; ".join(parts)[:1000]


def _times(snaps: list[RunSnapshot]) -> tuple[str, str]:
    created = min(s.record.created for s in snaps)
    updated = max(max(t for t in (s.record.created, s.record.started, s.record.finished, s.record.heartbeat)
                      if t is not None) for s in snaps)
    return iso(created), iso(updated)


def _run_task(snap: RunSnapshot) -> TaskView:
    created, updated = _times([snap])
    return TaskView(task_id=snap.run_id, status=STATUS[snap.record.state.value], message=_progress(snap),
                    created_at=created, updated_at=updated)


def _ablation_runs(f: Files, ablation_id: str, *, tick: bool = False) -> list[RunSnapshot]:
    snaps = training.views_for(f, tick=tick).list(group_id=ablation_id, limit=MAX_RUNS)
    if not snaps:
        raise ToolInputError(f"unknown task id '{ablation_id}': no ablation has this id; list_runs shows the runs "
                             "and their ids (an ablation's id is its runs' group_id)")
    return snaps


def _ablation_task(ablation_id: str, snaps: list[RunSnapshot]) -> TaskView:
    states = [s.record.state for s in snaps]
    done = sum(st.terminal for st in states)
    if done < len(snaps):
        status: Status = "working"
    else:
        status = "cancelled" if any(st.value == "stopped" for st in states) else "completed"
    now = [f"{s.record.variant or s.run_id}: {_progress(s)}" for s in snaps if s.record.state.value == "running"]
    message = f"{done}/{len(snaps)} runs of the ablation finished" + (f"; {now[0]}" if now else "")
    created, updated = _times(snaps)
    return TaskView(task_id=ablation_id, status=status, message=message[:1000], created_at=created,
                    updated_at=updated)


def task_of(f: Files, task_id: str) -> TaskView:
    """The task of a run id or an ablation id (advancing the queue first, as run_status does); an unknown id is a
    ToolInputError / RunError naming what to do."""
    if task_id.startswith(ABLATION_PREFIX):
        return _ablation_task(task_id, _ablation_runs(f, task_id, tick=True))
    return _run_task(training.views_for(f, tick=True).get(task_id))


def recent(f: Files, limit: int = MAX_RUNS) -> list[TaskView]:
    """The newest runs as tasks (each run of an ablation is a task of its own too)."""
    return [_run_task(s) for s in training.views_for(f, tick=True).list(limit=limit)]


def outcome(f: Files, task_id: str) -> tuple[dict, bool]:
    """(the task's result as structured content, whether it is an error): a run's status and summary.json, or an
    ablation's comparison table. Scrubbed of the channel's key."""
    if task_id.startswith(ABLATION_PREFIX):
        report = report_metrics(f, task_id, plot=False).model_dump(mode="json")
        return scrub_obj(report, known_secrets(f)), False
    status = run_resources.run_status(f, task_id, f"vapo://runs/{task_id}")
    summary = training.views_for(f).get(task_id).rundir.summary()
    failed = status["run"]["state"] == "failed"
    return {**status, "summary": scrub_obj(summary, known_secrets(f))}, failed


def cancel(f: Files, task_id: str) -> TaskView:
    """A graceful stop: the run (every unfinished run of an ablation) checkpoints, then exits; queued ones are
    dropped. The task turns cancelled once the run has stopped."""
    if task_id.startswith(ABLATION_PREFIX):
        snaps = _ablation_runs(f, task_id)
        left = [s.run_id for s in snaps if not s.record.state.terminal]
        if not left:
            raise ToolInputError(f"task {task_id} is already {_ablation_task(task_id, snaps).status}: nothing to "
                                 f"cancel; report_metrics('{task_id}') shows its results")
        for run_id in left:
            training.stop_run(f, run_id)
    else:
        training.stop_run(f, task_id)
    return task_of(f, task_id)
