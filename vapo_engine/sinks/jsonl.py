"""The `jsonl` sink: the run's append-only metrics.jsonl, which the run tools and the diagnostics read.

One JSON line per record, flushed at once, so a reader never sees half a record except possibly a torn last
line, which `vapo_engine.metrics.read_metrics` skips.
"""
from __future__ import annotations

import json

from vapo_engine.datafiles import open_append
from vapo_engine.rundir import METRICS

from .base import SinkContext


class JsonlSink:
    def __init__(self, ctx: SinkContext):
        self.path = ctx.run_dir.file(METRICS)
        self._f = open_append(self.path)  # never through a planted symlink (vapo_engine.datafiles)

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
