"""Metric sinks by name. config.toml's `logging.sinks` lists names from this table; a new sink is one module with
a class taking a `SinkContext` (a tracker: a `tracking.TrackerSink`, as mlflow.py and wandb.py), plus one entry
here — or, from outside the package, one `register_sink(name, factory)` call before the run starts
(`vapo_engine.registry.Registry`)."""
from __future__ import annotations

from collections.abc import Callable

from vapo_engine.config.train_model import SINK_NAME
from vapo_engine.registry import Registry, UnknownNameError

from .base import Sink, SinkContext
from .console import ConsoleSink
from .jsonl import JsonlSink
from .mlflow import MlflowSink
from .tensorboard import TensorBoardSink
from .wandb import WandbSink

SinkFactory = Callable[[SinkContext], Sink]

class UnknownSinkError(UnknownNameError):
    """`logging.sinks` names a sink that is not registered; the message lists the known ones."""


SINKS = Registry("metric sink", field="logging.sinks", name_pattern=SINK_NAME, unique=True,
                 error=UnknownSinkError, hint=" (code can add one with vapo_engine.sinks.register_sink)", entries={
                     "jsonl": JsonlSink,
                     "tensorboard": TensorBoardSink,
                     "console": ConsoleSink,
                     "mlflow": MlflowSink,  # optional extra vapo-mcp[mlflow]; a warning and no tracking without it
                     "wandb": WandbSink,  # optional extra vapo-mcp[wandb]; likewise
                 })


def register_sink(name: str, factory: SinkFactory) -> SinkFactory:
    """Make `factory` available as `name` in `logging.sinks` (in this process). A name already taken by
    another factory is refused."""
    return SINKS.register(name, factory)


def sink_names() -> list[str]:
    return SINKS.names()


def sink_factories(names: list[str]) -> list[SinkFactory]:
    """The factories of `names`, in order; any unknown name raises UnknownSinkError naming the known ones."""
    return SINKS.lookup_all(names)
