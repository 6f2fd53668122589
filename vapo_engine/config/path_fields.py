"""The config's path fields, listed once: every field of config.toml typed `PathText` (config/base.py).

Whatever treats paths — making them absolute in a run's frozen config (`freeze_paths`), confining them for a
remote caller (tools.access), checking them on disk (config/local_paths.py) — walks `path_fields()`, so a new path
field is covered by being typed `PathText`; tests/test_path_fields.py checks that each one is confined.

Two of them may name a task instead of a file (`TASK_SPECS`: `builtin:…`, a registered benchmark, or a JSONL
file); the others are a file or folder. Torch-free.
"""
from __future__ import annotations

import typing
from functools import lru_cache
from pathlib import Path

from pydantic import AfterValidator

from .base import _plain_path
from .train_model import TrainConfig

TASK_SPECS = ("data.train", "eval.benchmark")
"""Path fields that may name a task: `builtin:…`, a benchmark name (`<data_dir>/<name>.jsonl`) or a .jsonl path."""


def _is_path(annotation: object, metadata: list) -> bool:
    found = [m for m in metadata if isinstance(m, AfterValidator) and m.func is _plain_path]
    if found:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_path(None, list(getattr(annotation, "__metadata__", ())))
    return any(_is_path(arg, []) for arg in typing.get_args(annotation))


@lru_cache(maxsize=1)
def path_fields() -> tuple[str, ...]:
    """'section.key' of every `PathText` field of the training config, in declaration order."""
    out = []
    for section, info in TrainConfig.model_fields.items():
        for name, field in info.annotation.model_fields.items():
            if _is_path(field.annotation, list(field.metadata)):
                out.append(f"{section}.{name}")
    return tuple(out)


def get_path(config: TrainConfig, key: str) -> str | None:
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def freeze_paths(config: TrainConfig, base_dir: str | Path) -> TrainConfig:
    """Make the config's relative paths (every path field) absolute against `base_dir`, so that the frozen copy in
    a run directory means the same thing from any working directory. A task spec stays a name unless it is a
    relative `.jsonl` path."""
    base = Path(base_dir).resolve()
    fix = (lambda p: p if p is None or Path(p).expanduser().is_absolute() else str((base / p).resolve()))
    updates: dict[str, dict[str, str | None]] = {}
    for key in path_fields():
        if key not in TASK_SPECS:
            section, name = key.split(".")
            updates.setdefault(section, {})[name] = fix(get_path(config, key))
    data_dir = updates["data"]["data_dir"]
    for key in TASK_SPECS:
        section, name = key.split(".")
        updates.setdefault(section, {})[name] = _freeze_spec(get_path(config, key), data_dir)
    return config.model_copy(update={s: getattr(config, s).model_copy(update=u) for s, u in updates.items()})


def _freeze_spec(spec: str, data_dir: str) -> str:
    """A relative `.jsonl` task path made absolute the way `tasks.get_task` resolves it now (the working
    directory, else the data dir), so a worker started from another directory reads the same file."""
    p = Path(spec.strip()).expanduser()
    if not spec.strip().endswith(".jsonl") or p.is_absolute():
        return spec
    return str((p if p.exists() else Path(data_dir) / p).resolve())
