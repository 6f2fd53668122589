"""What the experiment-tracker sinks (mlflow.py, wandb.py) share: the run as a tracker sees it, and a sender
thread that keeps the tracker off the training loop's path.

`TrackerSink.write` only queues the record; a daemon thread opens the tracker (import already checked, the
connection and run made there), sends each record and, at close, the artifacts. A missing package, an
unreachable tracker or any tracker error is one WARNING line in the worker log (`SinkContext.log`) and the sink
disables itself: the run never fails or waits on a tracker (close waits at most `CLOSE_WAIT_S`).
"""
from __future__ import annotations

import json
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vapo_engine.config.secrets import redact_tokens
from vapo_engine.rundir import SUMMARY_JSON, RunDir

from .base import SinkContext

CLOSE_WAIT_S = 60.0
QUEUE_LIMIT = 100_000
_CLOSE = object()


@dataclass(frozen=True)
class TrackedRun:
    """The run as a tracker records it: the run id (the tracker run's name), the experiment and tags from
    settings.json (run.json's snapshot of them), the frozen config (config.json, already redacted) and the
    folders involved."""

    run_id: str
    experiment: str
    tags: tuple[str, ...]
    config: dict
    run_dir: RunDir

    @classmethod
    def of(cls, ctx: SinkContext) -> TrackedRun:
        meta = ctx.run_dir.meta()
        return cls(str(meta.get("run_id") or ctx.run_dir.path.name),
                   str(meta.get("experiment") or ctx.run_dir.path.parent.name),
                   tuple(str(t) for t in meta.get("tags") or ()), ctx.run_dir.config(), ctx.run_dir)

    @property
    def log_dir(self) -> Path:
        """runtime.log_dir: runs live in <log_dir>/<experiment>/<run id>."""
        return self.run_dir.path.parent.parent

    def params(self) -> dict[str, str]:
        """The config flattened to dotted keys ("training.total_steps"), each value as text (lists and None as
        JSON), as trackers that take flat parameters want them."""
        return flatten(self.config)

    def summary(self, since: float) -> dict | None:
        """summary.json when this attempt wrote it (modified after `since`), else None."""
        mtime = self.run_dir.mtime(SUMMARY_JSON)
        return self.run_dir.summary() if mtime is not None and mtime >= since - 1 else None

    def artifacts(self, folder: Path, since: float) -> list[Path]:
        """The files a tracker keeps at the end: the plot report_metrics draws (report.png, drawn into
        `folder`) and this attempt's summary.json."""
        out = []
        records = [r for r in self.run_dir.metrics() if r.get("kind") in ("train", "eval")]
        if any(r.get("kind") == "train" for r in records):
            from vapo_engine.plots import plot_run
            out.append(plot_run(records, folder / "report.png", f"run {self.run_id}"))
        if self.summary(since) is not None:
            out.append(self.run_dir.file(SUMMARY_JSON))
        return out


def flatten(obj: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


class TrackerSink:
    """A sink that hands records to a tracker from its own thread. Subclasses set `name` and `extra`, and
    implement `load()` (import the tracker's package; ImportError when it is missing), `open(run)`,
    `send(record)` and `finish(artifacts, summary)`, each called on the sender thread only."""

    name = "tracker"
    extra = "tracker"

    def __init__(self, ctx: SinkContext):
        self.ctx, self.run = ctx, TrackedRun.of(ctx)
        self._opened_at = time.time()
        self._queue: queue.Queue = queue.Queue(QUEUE_LIMIT)
        self._thread: threading.Thread | None = None
        self.disabled = False
        try:
            self.load()
        except ImportError as e:
            self.warn(f"the {self.name} package is not installed ({e})",
                      f"pip install 'vapo-mcp[{self.extra}]' in the environment that runs the trainer")
            return
        self._thread = threading.Thread(target=self._serve, name=f"{self.name}-sink", daemon=True)
        self._thread.start()

    # --- the trainer's side --------------------------------------------------------------------------------------
    def write(self, record: dict) -> None:
        if self._thread is None or self.disabled:
            return
        try:
            self._queue.put_nowait(dict(record))
        except queue.Full:
            self.warn(f"{QUEUE_LIMIT} records are waiting for the tracker", "check that it is reachable")

    def close(self) -> None:
        if self._thread is None:
            return
        self._queue.put(_CLOSE)
        self._thread.join(CLOSE_WAIT_S)
        if self._thread.is_alive():
            self.warn(f"the tracker did not finish within {CLOSE_WAIT_S:.0f} s; what it had not received is "
                      "lost", "check that it is reachable")
        self._thread = None

    def warn(self, what: str, fix: str) -> None:
        """One WARNING line in the worker log (URL credentials and key-like tokens redacted); the sink stops
        sending (the run goes on)."""
        if not self.disabled:
            self.disabled = True
            self.ctx.log(f"WARNING: metric sink {self.name!r} disabled: {redact_tokens(what)[:400]}; the run goes "
                         f"on without it ({fix})")

    # --- the sender thread ---------------------------------------------------------------------------------------
    def _serve(self) -> None:
        if self._step("cannot open the tracker", self.open):
            while (item := self._queue.get()) is not _CLOSE:
                if not self.disabled:
                    self._step("sending a record failed", self.send, item)
            if not self.disabled:
                with tempfile.TemporaryDirectory(prefix=f"vapo-{self.name}-") as tmp:
                    self._step("finishing the tracker run failed", lambda: self.finish(
                        self.run.artifacts(Path(tmp), self._opened_at), self.run.summary(self._opened_at)))

    def _step(self, what: str, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 - any tracker failure disables the sink, never the run
            self.warn(f"{what}: {type(e).__name__}: {e}", "check the tracker's settings in docs/training.md "
                      '"Experiment tracking"')
            return False

    # --- what a tracker implements -------------------------------------------------------------------------------
    def load(self) -> None:
        raise NotImplementedError

    def open(self) -> None:
        raise NotImplementedError

    def send(self, record: dict) -> None:
        raise NotImplementedError

    def finish(self, artifacts: list[Path], summary: dict | None) -> None:
        raise NotImplementedError
