"""Runs as durable background jobs: SQLite registry, state machine, detached supervisors, and the read model
the tools show runs through (views). Torch-free."""
from .manager import RunError, RunManager
from .registry import Registry, RunRecord
from .states import MESSAGES, State
from .views import RunSnapshot, RunViews

__all__ = ["MESSAGES", "Registry", "RunError", "RunManager", "RunRecord", "RunSnapshot", "RunViews", "State"]
