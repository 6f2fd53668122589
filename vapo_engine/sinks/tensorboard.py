"""The `tensorboard` sink: event files under the run's tb/ (`tensorboard --logdir <log_dir>`).

The only module that imports TensorBoard. It is optional at run time: without the tensorboard package the sink
writes nothing.
"""
from __future__ import annotations

from vapo_engine.rundir import TB

from .base import SinkContext, metric_items


class TensorBoardSink:
    def __init__(self, ctx: SinkContext):
        try:
            from torch.utils.tensorboard import SummaryWriter
            self._writer = SummaryWriter(str(ctx.run_dir.file(TB)))
        except ImportError:  # tensorboard is optional at run time
            self._writer = None

    def write(self, record: dict) -> None:
        if self._writer is not None:
            for name, value in metric_items(record):
                self._writer.add_scalar(name, value, record["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
