"""Runs as durable background jobs: SQLite registry, state machine, detached supervisors. Torch-free."""
from .manager import RunError, RunManager
from .registry import Registry, RunRecord
from .states import MESSAGES, State

__all__ = ["MESSAGES", "Registry", "RunError", "RunManager", "RunRecord", "State"]
