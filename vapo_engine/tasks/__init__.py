"""Verifiable tasks for RL: built-in arithmetic generators and user JSONL sets, resolved by `get_task`.

    get_task("builtin:addition", data_dir)   # procedurally generated, exact checker, reference solutions
    get_task("my_set", data_dir)             # <data_dir>/my_set.jsonl, robust answer checker
    get_task("aime_2024", data_dir)          # the same, fetched from the Hugging Face Hub when missing
    get_task("/path/to/set.jsonl", data_dir) # an explicit file

A registered benchmark name (`benchmarks.BENCHMARKS`: aime_2024, aime_2025, math500, gsm8k, gsm8k_train)
whose file is missing is downloaded and converted into `<data_dir>/<name>.jsonl` by `hub.fetch_benchmark` the
first time it is resolved (for a run: when `start_training` / `vapo-mcp train` validates the config, before
the run is queued), then read like any other file; a file already there is used as it is. Any other missing
name is a `TaskError` that says where to put it. Torch-free on purpose (standard library + math-verify;
huggingface_hub only inside the fetch): config validation and the MCP tools import it.
"""
from __future__ import annotations

from pathlib import Path

from .answers import answers_match, builtin_answer_correct, extract_final_answer
from .arithmetic import BUILTIN_TASKS, AdditionTask, ArithmeticTask, MultistepTask
from .base import Problem, Task, TaskError
from .benchmarks import BENCHMARKS, Benchmark, benchmark_names
from .hub import fetch_benchmark
from .jsonl import JsonlTask, load_jsonl

BUILTIN_PREFIX = "builtin:"

__all__ = [
    "BENCHMARKS", "BUILTIN_PREFIX", "BUILTIN_TASKS", "AdditionTask", "ArithmeticTask", "Benchmark",
    "JsonlTask", "MultistepTask", "Problem", "Task", "TaskError", "answers_match", "benchmark_names",
    "builtin_answer_correct", "builtin_task_names", "extract_final_answer", "fetch_benchmark", "get_task",
    "load_jsonl",
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
    """Resolve `builtin:<name>`, a path ending in `.jsonl`, or a bare name (-> `<data_dir>/<name>.jsonl`,
    fetched first when it is a registered benchmark and the file is missing)."""
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
    if spec in BENCHMARKS and not path.exists():
        fetch_benchmark(spec, data_dir)  # a TaskError with the three ways out when it cannot
    hint = (f"put the file at {path} (<data_dir>/<name>.jsonl, one {{\"problem\", \"answer\"}} object per "
            f"line), {others}, or name a registered benchmark that is downloaded when missing "
            f"({', '.join(benchmark_names())})")
    if spec in BUILTIN_TASKS and not path.exists():
        hint += f" (did you mean {BUILTIN_PREFIX + spec!r})"
    return JsonlTask.from_file(path, name=spec, missing_hint=hint)
