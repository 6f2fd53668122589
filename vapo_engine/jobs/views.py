"""The read model of runs: one place that says what a run is now — its registry record (state, message,
identity), its progress and its latest metrics — for every tool that shows runs (list_runs, run_status,
stop_run / resume_run results, report_metrics, the ablation table) and for what will read runs next (MCP
resources and tasks).

Latest metrics come from the end of metrics.jsonl (`vapo_engine.metrics.latest`, cached by the file's identity),
so showing a run costs what its last few records cost, however long it ran; a run's whole history is parsed
only when asked for (`RunSnapshot.history`, the curves of report_metrics). Read-only: advancing the queue
(`RunManager.tick`) is the caller's choice. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from vapo_engine.metrics import STEP, latest, read_metrics
from vapo_engine.rundir import METRICS, PROVIDER_JSON, ROLLOUT_JSON, RunDir

from .manager import RunError, RunManager
from .registry import RunRecord

MAX_SKIPPED = 20


@dataclass(frozen=True)
class RunSnapshot:
    """A run as the tools show it: the registry record plus what its run directory says now."""

    record: RunRecord
    latest: dict[str, dict] = field(repr=False)
    """The last record of each kind ("train", "eval") in metrics.jsonl ({} when none)."""
    total_steps: int | None = None
    """training.total_steps of the run's frozen config (None when unreadable)."""

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def rundir(self) -> RunDir:
        return RunDir(self.record.run_dir)

    @property
    def step(self) -> int:
        """The latest policy step with metrics (0 before the first)."""
        return self.latest.get("train", {}).get(STEP, 0)

    @property
    def latest_eval(self) -> dict[str, float]:
        """The numbers of the latest held-out evaluation (eval/* names only)."""
        return {k: float(v) for k, v in self.latest.get("eval", {}).items()
                if k.startswith("eval/") and isinstance(v, (int, float)) and not isinstance(v, bool)}

    @cached_property
    def history(self) -> dict[str, list[dict]]:
        """Every record by kind, the newest of each step in step order (a resumed run redoes the steps after its
        checkpoint). Parses the whole metrics file: for curves, not for showing a run."""
        by_kind: dict[str, dict[int, dict]] = {}
        for r in read_metrics(self.rundir.file(METRICS)):
            by_kind.setdefault(r.get("kind"), {})[r[STEP]] = r
        return {kind: [recs[s] for s in sorted(recs)] for kind, recs in by_kind.items()}

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the worker log (bounded)."""
        return self.rundir.log_tail(lines)

    def provider_down(self) -> dict | None:
        """Why [provider_rollouts] stopped asking the API channel ({kind, reason, fix}), None while it asks."""
        down = (self.rundir.read_json(PROVIDER_JSON) or {}).get("down")
        return down if isinstance(down, dict) else None

    def rollout_servers(self) -> str | None:
        """What the trainer's inference servers lack (rollout.json: every replica down, waiting; or given up),
        None while they answer (or the run samples in process)."""
        state = self.rundir.read_json(ROLLOUT_JSON) or {}
        down, waiting = state.get("down"), state.get("waiting")
        if isinstance(down, dict):
            return f"gave up on the rollout servers: {down.get('reason')} — fix: {down.get('fix')}"[:800]
        if not isinstance(waiting, dict) or self.record.state.value != "running":
            return None
        urls = "; ".join(f"{r.get('url')} ({r.get('error') or 'not tried'})" for r in waiting.get("replicas") or []
                         if isinstance(r, dict))
        return (f"waiting for the rollout servers (no replica answers, {waiting.get('since_s')}s so far; the run "
                f"fails after rollout.unavailable_timeout_s = {waiting.get('timeout_s')}s): {urls}")[:800]


class RunViews:
    """Runs as the tools read them, over one run manager's registry."""

    def __init__(self, manager: RunManager):
        self.manager = manager

    def of(self, rec: RunRecord) -> RunSnapshot:
        rd = RunDir(rec.run_dir)
        if rd.path.is_symlink():  # shown from its registry record only; get() refuses it
            return RunSnapshot(rec, {}, None)
        total = (rd.config().get("training") or {}).get("total_steps")
        return RunSnapshot(rec, latest(rd.file(METRICS)),
                           total if isinstance(total, int) and not isinstance(total, bool) else None)

    def get(self, run_id: str) -> RunSnapshot:
        """One run; an unknown id raises RunError (saying so when the id's record was skipped by a rebuild)."""
        try:
            rec = self.manager.get(run_id)
        except RunError as e:
            mine = [s for s in self.skipped() if run_id in s]
            raise RunError(f"{e}; this id was skipped when the registry was rebuilt: {mine[0]}" if mine
                           else str(e)) from None
        if RunDir(rec.run_dir).path.is_symlink():
            raise RunError(f"run {run_id}'s directory {rec.run_dir} is a symbolic link; the run tools read and write "
                           "only real run folders (a link could point them at any folder): move the run folder "
                           "itself there, or start_training again")
        return self.of(rec)

    def list(self, *, state: str | None = None, experiment: str | None = None, tag: str | None = None,
             group_id: str | None = None, limit: int = 20) -> list[RunSnapshot]:
        """Runs newest first, filtered."""
        return [self.of(r) for r in self.manager.registry.list(state=state, experiment=experiment, tag=tag,
                                                               group_id=group_id, limit=limit)]

    def skipped(self) -> list[str]:
        """What the last registry rebuild could not index, each with why (bounded)."""
        return [f"{where}: {why}"[:600] for where, why in sorted(self.manager.registry.skipped().items())][
            :MAX_SKIPPED]
