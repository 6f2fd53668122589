"""One registry helper for every "name → implementation" table of the project: advantage estimators and policy
losses (algo/registry.py), rollout backends (rollout/backends/registry.py), metric sinks (sinks/registry.py),
episodes (rollout/episodes.py), verifiers (tasks/verifiers.py) and the built-in tool servers
(toolservers/__init__.py). docs/design.md "Extending" says where each new entry goes.

A `Registry` is a dict (name → entry) with:
- `register(name, entry)` or `@register(name)`: add an entry; a name must look like `name_pattern`; with
  `unique=True` a second, different entry under a taken name is refused;
- `lookup(name)`: the entry, or an error of the registry's `error` class (a `UserError` and a `KeyError` by
  default) that names the config field, the wrong name and every known one — never a bare KeyError;
- `package`: entries may live in modules of their own in that package, `<package>/<name>.py`, which register
  themselves when imported; `lookup` imports the module of a name not registered yet, and `names()` lists those
  modules too, so adding one is one file (plus, for a table of direct entries, one line).

Torch-free and dependency-free (imports only `vapo_engine.errors`), so the config checker and the MCP tools can
list names without loading any implementation.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterable
from typing import Any

from .errors import UserError


class UnknownNameError(UserError, KeyError):
    """A name that no entry of a registry has; the message lists the known ones. A UserError and a KeyError."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class Registry(dict):
    """Name → entry, for one kind of thing (`what`, e.g. "rollout backend"), chosen by a config `field`."""

    def __init__(self, what: str, *, field: str = "", entries: dict[str, Any] | None = None,
                 package: str | None = None, not_entries: Iterable[str] = (), name_pattern: str = r"^[a-z][a-z0-9_]*$",
                 unique: bool = False, error: type[Exception] = UnknownNameError, hint: str = ""):
        super().__init__()
        self.what, self.field, self.package, self.unique, self.error, self.hint = what, field, package, unique, error, hint
        self.not_entries = set(not_entries)
        self.pattern = re.compile(name_pattern)
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry: Any = None) -> Any:
        """Add `entry` under `name` (returns it); without `entry`, a decorator that does."""
        if not isinstance(name, str) or not self.pattern.match(name):
            raise ValueError(f"{self.what} name {name!r} must match {self.pattern.pattern}")

        def add(obj: Any) -> Any:
            if self.unique and self.get(name, obj) is not obj:
                raise ValueError(f"a {self.what} named {name!r} is already registered")
            self[name] = obj
            return obj
        return add if entry is None else add(entry)

    def names(self) -> list[str]:
        """Registered names and, with a `package`, the names of its entry modules; sorted."""
        return sorted(set(self) | set(self._module_names()))

    def lookup(self, name: str) -> Any:
        """The entry of `name` (importing `<package>.<name>` first when it is not registered yet), else the
        registry's error naming the field, the name and the known ones."""
        if name not in self and self.package and isinstance(name, str) and self.pattern.match(name) \
                and name not in self.not_entries:
            try:
                importlib.import_module(f"{self.package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{self.package}.{name}":
                    raise  # the entry's module exists but needs a package that is not installed: say so as it is
        if isinstance(name, str) and name in self:
            return self[name]
        raise self.error(self.unknown_message([name]))

    def lookup_all(self, names: Iterable[str]) -> list[Any]:
        """The entries of `names` in order; every unknown one is named in one error."""
        names = list(names)
        unknown = [n for n in names if not self._known(n)]
        if unknown:
            raise self.error(self.unknown_message(unknown))
        return [self.lookup(n) for n in names]

    def unknown_message(self, names: list) -> str:
        shown = ", ".join(map(repr, names))
        where = f"{self.field}: " if self.field else ""
        fix = f" (set {self.field} to one of them)" if self.field and len(names) == 1 else ""
        return (f"{where}unknown {self.what}{'s' if len(names) > 1 else ''} {shown}; known {self.what}s: "
                f"{', '.join(self.names())}{fix}{self.hint}")

    def _known(self, name: Any) -> bool:
        try:
            self.lookup(name)
            return True
        except self.error:
            return False

    def _module_names(self) -> list[str]:
        if not self.package:
            return []
        mod = importlib.import_module(self.package)
        return [m.name for m in pkgutil.iter_modules(getattr(mod, "__path__", []))
                if self.pattern.match(m.name) and m.name not in self.not_entries]

