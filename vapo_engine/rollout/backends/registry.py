"""Rollout backends by name: `register_backend` adds one, `make_backend` builds the one a run's `[rollout]`
section names (`rollout.backend`).

A backend is registered as a factory that takes the `[rollout]` config section (a `RolloutBackend` subclass
whose `__init__` takes it will do). A backend in a file of its own, `backends/<name>.py`, needs no other
change: looking up a name that is not registered yet imports that module, whose `@register_backend("<name>")`
registers it (`vapo_engine.registry.Registry` with a package). An unknown name is a clear error that lists the
known ones.
"""
from __future__ import annotations

import re
from typing import Any

from vapo_engine.registry import Registry, UnknownNameError

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
"""What a backend name looks like (also the module name of a backend in its own file)."""


class UnknownBackendError(UnknownNameError):
    """`rollout.backend` names no backend; the message lists the known ones. Also a KeyError."""


BACKENDS = Registry("rollout backend", field="rollout.backend", package=__package__,
                    not_entries={"base", "registry"}, name_pattern=NAME.pattern, error=UnknownBackendError)


def register_backend(name: str):
    """Decorator: register a backend factory (or class) under `name`; a second registration replaces it."""
    return BACKENDS.register(name)


def backend_names() -> list[str]:
    """Registered names and those of the backend modules in this package, sorted."""
    return BACKENDS.names()


def get_backend(name: str) -> Any:
    """The factory registered as `name` (importing `backends/<name>.py` first if needed)."""
    return BACKENDS.lookup(name)


def make_backend(options):
    """The backend that the `[rollout]` section `options` names (`options.backend`), built from `options`."""
    return get_backend(options.backend)(options)
