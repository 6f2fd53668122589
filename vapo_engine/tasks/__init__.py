"""Verifiable tasks for RL: built-in arithmetic generators and user JSONL sets, resolved by `get_task`.

    get_task("builtin:addition", data_dir)   # procedurally generated, exact checker, reference solutions
    get_task("aime_2024", data_dir)          # <data_dir>/aime_2024.jsonl, robust answer checker
    get_task("/path/to/set.jsonl", data_dir) # an explicit file

Torch-free on purpose (standard library + math-verify): config validation and the MCP tools import it.
Nothing here downloads data; a missing file is a `TaskError` that says where to put it.
"""
from __future__ import annotations

from pathlib import Path

from .answers import answers_match, builtin_answer_correct, extract_final_answer
from .arithmetic import BUILTIN_TASKS, AdditionTask, ArithmeticTask, MultistepTask
from .base import Problem, Task, TaskError
from .jsonl import JsonlTask, load_jsonl

BUILTIN_PREFIX = "builtin:"

__all__ = [
    "BUILTIN_PREFIX", "BUILTIN_TASKS", "AdditionTask", "ArithmeticTask", "JsonlTask", "MultistepTask",
    "Problem", "Task", "TaskError", "answers_match", "builtin_answer_correct", "builtin_task_names",
    "extract_final_answer", "get_task", "load_jsonl",
]


def builtin_task_names() -> list[str]:
    """Every valid `builtin:<name>` spec."""
    return [BUILTIN_PREFIX + name for name in BUILTIN_TASKS]


def _builtin(name: str) -> Task:
    cls = BUILTIN_TASKS.get(name)
    if cls is None:
        raise TaskError(
            f"unknown built-in task {BUILTIN_PREFIX + name!r}. "
            f"Fix: use one of {', '.join(builtin_task_names())}, or a JSONL name/path."
        )
    return cls()


def get_task(spec: str, data_dir: str | Path = "./data") -> Task:
    """Resolve `builtin:<name>`, a path ending in `.jsonl`, or a bare name (-> `<data_dir>/<name>.jsonl`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TaskError(f"empty task spec. Fix: use {' or '.join(builtin_task_names())} or a JSONL name.")
    spec = spec.strip()
    if spec.startswith(BUILTIN_PREFIX):
        return _builtin(spec[len(BUILTIN_PREFIX):])
    data_dir = Path(data_dir)
    others = f"or use a built-in task ({', '.join(builtin_task_names())})"
    if spec.endswith(".jsonl"):
        path = Path(spec).expanduser()
        if not path.is_absolute() and not path.exists() and (data_dir / path).exists():
            path = data_dir / path
        hint = f"create {path} with one {{\"problem\", \"answer\"}} object per line, {others}"
        return JsonlTask.from_file(path, missing_hint=hint)
    path = data_dir / f"{spec}.jsonl"
    hint = (f"put the file at {path} (<data_dir>/<name>.jsonl, one {{\"problem\", \"answer\"}} object per "
            f"line), {others}")
    if spec in BUILTIN_TASKS and not path.exists():
        hint += f" (did you mean {BUILTIN_PREFIX + spec!r})"
    return JsonlTask.from_file(path, name=spec, missing_hint=hint)
