"""User data sets: a JSONL file of `{"problem": str, "answer": str|number}` per line (optional `"id"`).

`load_jsonl` reads and validates the whole file up front and raises `TaskError` naming the file, the line
number and the fix (missing file, bad JSON, missing/empty fields, empty file). `JsonlTask` samples training
problems from the file with the caller's rng, returns the first n lines as its deterministic held-out list,
and rewards with the robust checker (`answers.answers_match`). Nothing is ever downloaded, and a JSONL set
has no reference solutions (the SFT warm-start uses built-in tasks only). The file is used verbatim: the
problem text is the prompt, with no template added.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from .answers import answers_match
from .base import Problem, TaskError

_FORMAT = 'one JSON object per line: {"problem": "...", "answer": "..."} (optional "id")'


def _field_text(value: object) -> str | None:
    """A usable string for a problem/answer field, or None when missing, empty or of the wrong type."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _parse_line(path: Path, lineno: int, line: str) -> Problem:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskError(
            f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}). Fix: write {_FORMAT}."
        ) from None
    if not isinstance(row, dict):
        raise TaskError(
            f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}. Fix: write {_FORMAT}."
        )
    fields = {}
    for key in ("problem", "answer"):
        text = _field_text(row.get(key))
        if text is None:
            state = "missing" if key not in row else "empty or not a string/number"
            raise TaskError(
                f"{path}:{lineno}: field {key!r} is {state}. Fix: give every line a non-empty "
                f'"{key}" ({_FORMAT}).'
            )
        fields[key] = text
    raw_id = row.get("id")
    pid = str(raw_id) if raw_id not in (None, "") else f"{path.stem}-{lineno}"
    return Problem(id=pid, prompt=fields["problem"], answer=fields["answer"].strip())


def load_jsonl(path: str | Path, *, missing_hint: str = "") -> list[Problem]:
    """Read and validate every line of `path`; raises `TaskError` with file, line and fix."""
    path = Path(path)
    if not path.is_file():
        hint = missing_hint or f"create {path} with {_FORMAT}"
        raise TaskError(f"{path}: data file not found (nothing is downloaded). Fix: {hint}.")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read the file ({e}). Fix: save it as UTF-8, {_FORMAT}.") from None
    problems = [
        _parse_line(path, lineno, line)
        for lineno, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not problems:
        raise TaskError(f"{path}: the file has no problems. Fix: add at least one line, {_FORMAT}.")
    return problems


class JsonlTask:
    """A task backed by a JSONL file: random training draws, first-n held-out list, robust 0/1 reward."""

    max_new_tokens = None
    verifier = "math"
    """The default verifier (tasks/verifiers.py): boxed / last number, exact rationals, then math-verify."""
    """No built-in limit: the training config's `model.max_tokens` applies."""
    system_prompt = ("Solve the problem. Reason step by step, then give the final answer on the last line as "
                     "\\boxed{answer}.")
    """The format instruction sent with every prompt to an API model (provider samples, channel evaluation)."""

    def __init__(self, name: str, problems: list[Problem], path: Path | None = None):
        if not problems:
            raise TaskError(f"{path or name}: no problems")
        self.name, self.problems, self.path = name, list(problems), path

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None, missing_hint: str = "") -> JsonlTask:
        path = Path(path)
        return cls(name or path.stem, load_jsonl(path, missing_hint=missing_hint), path)

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        """`n` problems drawn without replacement while the file lasts, then with replacement."""
        if n <= len(self.problems):
            return rng.sample(self.problems, n)
        return [rng.choice(self.problems) for _ in range(n)]

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` lines (all of them if the file is shorter)."""
        return self.problems[: max(n, 0)]

    def reward(self, response: str, answer: str) -> float:
        return 1.0 if answers_match(response, answer) else 0.0

    def reference_solution(self, problem: Problem) -> str:
        raise TaskError(
            f"{self.name}: a JSONL set has no reference solutions. Fix: use a built-in task "
            "(builtin:addition) for the SFT warm-start."
        )

    def __len__(self) -> int:
        return len(self.problems)

    def __repr__(self) -> str:
        return f"JsonlTask(name={self.name!r}, n={len(self.problems)}, path={str(self.path)!r})"
