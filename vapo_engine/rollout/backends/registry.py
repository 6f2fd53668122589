"""Rollout backends by name: `register_backend` adds one, `make_backend` builds the one a run's `[rollout]`
section names (`rollout.backend`).

A backend is registered as a factory that takes the `[rollout]` config section (a `RolloutBackend` subclass
whose `__init__` takes it will do). A backend in a file of its own, `backends/<name>.py`, needs no other
change: looking up a name that is not registered yet imports that module, whose `@register_backend("<name>")`
registers it. An unknown name is a clear error that lists the known ones.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vapo_engine.errors import UserError

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
"""What a backend name looks like (also the module name of a backend in its own file)."""
_NOT_BACKENDS = {"base", "registry"}
_BACKENDS: dict[str, Callable[[Any], Any]] = {}


class UnknownBackendError(UserError, KeyError):
    """`rollout.backend` names no backend; the message lists the known ones. Also a KeyError."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def register_backend(name: str):
    """Decorator: register a backend factory (or class) under `name`; a second registration replaces it."""
    if not NAME.match(name):
        raise ValueError(f"backend name {name!r}: use lowercase letters, digits and _ (starting with a letter)")

    def add(factory):
        _BACKENDS[name] = factory
        return factory
    return add


def backend_names() -> list[str]:
    """Registered names and those of the backend modules in this package, sorted."""
    here = [m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])]
    return sorted(set(_BACKENDS) | {n for n in here if NAME.match(n) and n not in _NOT_BACKENDS})


def get_backend(name: str) -> Callable[[Any], Any]:
    """The factory registered as `name` (importing `backends/<name>.py` first if needed)."""
    if isinstance(name, str) and NAME.match(name) and name not in _BACKENDS and name not in _NOT_BACKENDS:
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise  # the backend's module exists but needs a package that is not installed: say so as it is
    if name not in _BACKENDS:
        raise UnknownBackendError(f"unknown rollout backend {name!r}; known backends: {', '.join(backend_names())} "
                                  "(set rollout.backend to one of them)")
    return _BACKENDS[name]


def make_backend(options):
    """The backend that the `[rollout]` section `options` names (`options.backend`), built from `options`."""
    return get_backend(options.backend)(options)
