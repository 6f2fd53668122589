"""The run state machine: queued → running → succeeded | failed | stopped. Terminal states are final.

A resumed run is a new registry entry (same run directory, `resumed_from` set), so no terminal state is ever
left. Each state has a human message template; the registry stores the concrete message.
"""
from __future__ import annotations

from enum import Enum


class State(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED})

ALLOWED: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.RUNNING, State.STOPPED, State.FAILED}),
    State.RUNNING: frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.STOPPED: frozenset(),
}

MESSAGES: dict[State, str] = {
    State.QUEUED: "waiting for a free slot (max_concurrent runs at a time)",
    State.RUNNING: "training; poll run_status / report_metrics",
    State.SUCCEEDED: "finished all steps; see report_metrics",
    State.FAILED: "the worker failed; see the message and log tail; resume_run continues from the last checkpoint",
    State.STOPPED: "stopped on request after a checkpoint; resume_run continues it",
}


class InvalidTransition(RuntimeError):
    pass


def check_transition(old: State, new: State) -> None:
    if new not in ALLOWED[old]:
        raise InvalidTransition(f"cannot go from {old.value} to {new.value}"
                                + (" (terminal states are final)" if old.terminal else ""))
