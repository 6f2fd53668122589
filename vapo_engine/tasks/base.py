"""The task contract: a `Problem`, the `Task` protocol every task follows, `TaskError`, and the split helper.

A task hands out procedurally generated (or file-backed) training problems, a deterministic held-out split
that training can never produce, and a 0/1 reward. This file holds only the shared vocabulary; the
arithmetic tasks live in `arithmetic.py`, the JSONL sets in `jsonl.py`, answer checking in `answers.py`.
It deliberately imports no torch: the MCP tools and the config checker use it too.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vapo_engine.errors import UserError


@dataclass(frozen=True)
class Problem:
    """One verifiable problem: `prompt` is fed to the model as-is, `answer` is the gold final answer."""

    id: str
    prompt: str
    answer: str


class TaskError(UserError):
    """A task could not be resolved or its data is bad; the message names the file/line and the fix."""


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task (built-in or JSONL)."""

    name: str

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        """`n` training problems drawn with `rng` (never from the held-out split)."""
        ...

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` problems of the deterministic held-out split (same list on every call)."""
        ...

    def reward(self, response: str, answer: str) -> float:
        """1.0 when `response` states exactly the right final answer, else 0.0; never raises."""
        ...

    # A task may also name its default verifier (`verifier = "exact"`, a name in tasks/verifiers.VERIFIERS) that
    # runs score it when data.verifier is empty; without one, its `reward` is the verifier ("task").


def in_heldout_split(key: str, *, salt: str, fraction: float) -> bool:
    """True when `key` belongs to the held-out split: a stable hash (not Python's randomised `hash`).

    Train sampling rejects these keys and held-out sampling keeps only them, so the two can never overlap.
    """
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def sample_split(
    make: Callable[[random.Random], tuple[str, Problem]],
    n: int,
    rng: random.Random,
    *,
    heldout: bool,
    salt: str,
    fraction: float,
    unique: bool = False,
    max_tries_per_item: int = 1000,
) -> list[Problem]:
    """Draw `n` problems from `make(rng) -> (key, problem)` on one side of the hash split.

    `unique=True` drops repeated keys (used for the held-out list, which must not count a problem twice).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out: list[Problem] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > max_tries_per_item * max(n, 1):
            raise TaskError(f"could not draw {n} distinct problems for this split; ask for fewer")
        key, problem = make(rng)
        if in_heldout_split(key, salt=salt, fraction=fraction) != heldout:
            continue
        if unique:
            if key in seen:
                continue
            seen.add(key)
        out.append(problem)
    return out


def heldout_by_kind(make: Callable[[random.Random, object], tuple[str, Problem]], kinds: list, n: int,
                    rng: random.Random, *, salt: str, fraction: float) -> list[Problem]:
    """`n` distinct held-out problems, the kinds (difficulty buckets) taken in turn so each is measured; a kind
    whose 50 draws repeat earlier prompts is skipped that turn."""
    out: list[Problem] = []
    seen: set[str] = set()
    for i in range(n):
        kind = kinds[i % len(kinds)]
        for p in sample_split(lambda r, k=kind: make(r, k), 50, rng, heldout=True, salt=salt, fraction=fraction):
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
                break
    return out
