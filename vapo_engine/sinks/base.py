"""The one interface every metric sink implements, and what a sink is given when a run opens it.

A record is one dict {step, kind, time, <catalogue name>: value, ...} (kind: "train", "eval" or "pretrain"); a
value that is not finite arrives as its text ("nan", "inf"). Sinks receive every record the writing rank logs,
in order, and are closed once when the run ends.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vapo_engine.config import TrainConfig
from vapo_engine.metrics import KIND, STEP, TIME
from vapo_engine.rundir import RunDir


@runtime_checkable
class Sink(Protocol):
    """Receives a run's metric records. A sink is built by a factory `(SinkContext) -> Sink` registered under
    a name (vapo_engine.sinks.registry); config.toml's `logging.sinks` names the ones a run uses."""

    def write(self, record: dict) -> None:
        """Take one record (do not modify it: every sink gets the same dict)."""

    def close(self) -> None:
        """Flush and release whatever the sink holds; called once, when the run ends."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink factory may use: the run directory (run.json, config.json, files to write), the run's
    config, and `log`, where human-readable lines go (the worker's stdout; silent for in-process callers that
    pass a silent log)."""

    run_dir: RunDir
    config: TrainConfig
    log: Callable[[str], None]


def metric_items(record: dict) -> Iterator[tuple[str, float]]:
    """The record's metrics as (name, float) pairs, without step/kind/time; a non-finite value written as
    text becomes its float again."""
    for name, value in record.items():
        if name not in (STEP, KIND, TIME):
            yield name, float(value)
