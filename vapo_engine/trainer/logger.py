"""Metric sinks: append-only metrics.jsonl (+ TensorBoard) on the writing rank, a null sink elsewhere.

Every name written must be in `vapo_engine.metrics.CATALOGUE` (unknown names raise: names are an API).
Each record is one JSON line {step, kind, time, name: value, ...}, flushed at once, so a reader never
sees half a record except possibly a torn last line, which `read_metrics` skips.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from vapo_engine.metrics import CATALOGUE
from vapo_engine.rundir import METRICS, TB, RunDir


class MetricsLogger:
    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = RunDir(run_dir).file(METRICS)
        self._f = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(RunDir(run_dir).file(TB)))
            except ImportError:  # tensorboard is optional at run time
                self._tb = None

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> dict:
        unknown = [k for k in metrics if k not in CATALOGUE]
        if unknown:
            raise KeyError(f"metric names not in vapo_engine.metrics.CATALOGUE: {unknown}")
        clean = {k: (float(v) if math.isfinite(float(v)) else str(float(v))) for k, v in metrics.items()}
        rec = {"step": int(step), "kind": kind, "time": round(time.time(), 3), **clean}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
        return rec

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


class NullLogger:
    """For ranks that do not write."""

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> dict:
        return {"step": step, "kind": kind, **metrics}

    def close(self) -> None:
        pass
