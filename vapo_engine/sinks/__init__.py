"""Metric sinks: where a run's records go (metrics.jsonl, TensorBoard, the console; trackers as further sinks).

The trainer logs through `open_sinks(run_dir, cfg, ...)`, which opens the sinks named by config.toml's
`logging.sinks`; each sink implements `Sink` (`write(record)`, `close()`) and is registered by name
(`registry.SINKS`, `register_sink`). Importing this package does not import torch (the TensorBoard sink
imports it when it opens).
"""
from .base import Sink, SinkContext, metric_items
from .registry import SINKS, UnknownSinkError, register_sink, sink_factories, sink_names
from .stream import MetricsLogger, NullLogger, open_sinks

__all__ = ["SINKS", "MetricsLogger", "NullLogger", "Sink", "SinkContext", "UnknownSinkError", "metric_items",
           "open_sinks", "register_sink", "sink_factories", "sink_names"]
