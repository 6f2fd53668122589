"""Metric sinks by name. config.toml's `logging.sinks` lists names from this table; a new sink is one module with
a class taking a `SinkContext` (a tracker: a `tracking.TrackerSink`, as mlflow.py and wandb.py), plus one entry
here — or, from outside the package, one `register_sink(name, factory)` call before the run starts."""
from __future__ import annotations

import re
from collections.abc import Callable

from vapo_engine.config.train_model import SINK_NAME
from vapo_engine.errors import UserError

from .base import Sink, SinkContext
from .console import ConsoleSink
from .jsonl import JsonlSink
from .mlflow import MlflowSink
from .tensorboard import TensorBoardSink
from .wandb import WandbSink

SinkFactory = Callable[[SinkContext], Sink]

SINKS: dict[str, SinkFactory] = {
    "jsonl": JsonlSink,
    "tensorboard": TensorBoardSink,
    "console": ConsoleSink,
    "mlflow": MlflowSink,  # optional extra vapo-mcp[mlflow]; a warning and no tracking without it
    "wandb": WandbSink,  # optional extra vapo-mcp[wandb]; likewise
}


class UnknownSinkError(UserError):
    """`logging.sinks` names a sink that is not registered; the message lists the known ones."""


def register_sink(name: str, factory: SinkFactory) -> SinkFactory:
    """Make `factory` available as `name` in `logging.sinks` (in this process). A name already taken by
    another factory is refused."""
    if not isinstance(name, str) or not re.fullmatch(SINK_NAME, name):
        raise ValueError(f"sink name {name!r} must match {SINK_NAME} (lowercase letters, digits, _ and -)")
    if SINKS.get(name, factory) is not factory:
        raise ValueError(f"a metric sink named {name!r} is already registered")
    SINKS[name] = factory
    return factory


def sink_names() -> list[str]:
    return sorted(SINKS)


def sink_factories(names: list[str]) -> list[SinkFactory]:
    """The factories of `names`, in order; any unknown name raises UnknownSinkError naming the known ones."""
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        raise UnknownSinkError(f"logging.sinks: unknown metric sink(s) {', '.join(map(repr, unknown))}; known "
                               f"sinks: {', '.join(sink_names())} (code can add one with "
                               "vapo_engine.sinks.register_sink)")
    return [SINKS[n] for n in names]
