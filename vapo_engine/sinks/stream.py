"""The trainer's side of the metric stream: `log(step, kind, metrics) -> record` checks the names, builds the
record once and hands it to each of the run's sinks in order; `close()` closes them.

Every name must be in `vapo_engine.metrics.CATALOGUE` (unknown names raise KeyError: names are an API). A
record is {step, kind, time, name: value, ...}, a non-finite value written as its text ("nan").
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from vapo_engine.config import TrainConfig
from vapo_engine.metrics import CATALOGUE
from vapo_engine.rundir import RunDir

from .base import Sink, SinkContext
from .registry import sink_factories


class MetricsLogger:
    """The writing rank's entry point: one record per call, to every sink."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = list(sinks)

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> dict:
        unknown = [k for k in metrics if k not in CATALOGUE]
        if unknown:
            raise KeyError(f"metric names not in vapo_engine.metrics.CATALOGUE: {unknown}")
        clean = {k: (float(v) if math.isfinite(float(v)) else str(float(v))) for k, v in metrics.items()}
        rec = {"step": int(step), "kind": kind, "time": round(time.time(), 3), **clean}
        for sink in self.sinks:
            sink.write(rec)
        return rec

    def close(self) -> None:
        """Close every sink, even when one fails (the first failure is raised after)."""
        _close_all(self.sinks)


class NullLogger:
    """For ranks that do not write: the record is handed back, nothing is kept."""

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> dict:
        return {"step": step, "kind": kind, **metrics}

    def close(self) -> None:
        pass


def open_sinks(run_dir: str | Path, cfg: TrainConfig, *, write: bool = True,
               log: Callable[[str], None] = print) -> MetricsLogger | NullLogger:
    """The run's metric stream: the sinks named by `cfg.logging.sinks`, opened on `run_dir` (a NullLogger when
    this process does not `write`). The names are checked on every process first, so a bad name fails each
    rank alike (UnknownSinkError, a UserError naming the known sinks)."""
    factories = sink_factories(list(cfg.logging.sinks))
    if not write:
        return NullLogger()
    ctx = SinkContext(RunDir(Path(run_dir)), cfg, log)
    opened: list[Sink] = []
    try:
        for factory in factories:
            opened.append(factory(ctx))
    except BaseException:
        _close_all(opened, quiet=True)
        raise
    return MetricsLogger(opened)


def _close_all(sinks: list[Sink], quiet: bool = False) -> None:
    first = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as e:  # noqa: BLE001 - the others still close; the first failure is raised below
            first = first or e
    if first is not None and not quiet:
        raise first
