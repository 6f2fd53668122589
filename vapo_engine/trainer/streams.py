"""Named random streams: every random draw of the recipe comes from a stream named for what it is for.

A draw is seeded from (run seed, stream name, index, rank) alone — never from a shared generator that other
parts of the recipe also advance. So what one part draws cannot shift another's: two runs with the same seed
draw the same policy-step prompts at every step whether or not they pretrain a value model, evaluate, replay or
use another number of mini-batches (the paired designs of `bench.experiments.ablation` rest on this), and a resumed run
draws exactly what an uninterrupted one would, with no generator state in the checkpoint.

| stream | index | ranks | used for |
|---|---|---|---|
| `policy_prompts` | rollout step | shared | the prompts of each policy step |
| `pretrain_prompts` | pretraining round | shared | the prompts of each value-pretraining round |
| `sampling` | phase, step | own | generation (torch's global RNG, seeded inside a fork) |
| `shuffle` | phase, step | own | the mini-batch permutation |
| `replay` | policy step | own | which replayed positives join an update |
| `eval` | policy step | own | sampled held-out evaluation |
"""
from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator

import torch


def seed_of(seed: int, name: str, *index: int | str) -> int:
    """A 63-bit seed for draw `index` of stream `name` of a run with `seed` (stable across processes)."""
    key = ":".join(str(x) for x in (seed, name, *index))
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1


def rng(seed: int, name: str, *index: int | str) -> random.Random:
    """A Python generator for draw `index` of stream `name`."""
    return random.Random(seed_of(seed, name, *index))


def generator(seed: int, name: str, *index: int | str) -> torch.Generator:
    """A CPU torch generator for draw `index` of stream `name`."""
    return torch.Generator().manual_seed(seed_of(seed, name, *index))


@contextlib.contextmanager
def seeded(seed: int, name: str, *index: int | str, device: torch.device | None = None) -> Iterator[None]:
    """Seed torch's global RNG (CPU, and `device` when it is CUDA) for the block; the caller's state is
    restored afterwards. For code that draws from the global RNG (`model.generate`)."""
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed_of(seed, name, *index))
        yield


def digest(items: list[str]) -> float:
    """A 48-bit digest of a list of strings as an exact float (records compare it across runs)."""
    h = hashlib.blake2b("\n".join(items).encode(), digest_size=6).digest()
    return float(int.from_bytes(h, "big"))
