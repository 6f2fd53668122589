"""Checkpoints that cannot lie: HF-format weights (safetensors) + trainer state, written to a temporary
folder, marked DONE last, then renamed into `checkpoints/step-NNNNNNN/`. A folder without DONE is ignored.

Trainer state = optimizers, schedulers, RNG streams (torch, CUDA, the task/replay `random.Random`), replay
buffer, counters. Resume loads the newest complete checkpoint. Keeps the newest `keep` checkpoints.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch

DONE = "DONE"


def _ckpt_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    root = _ckpt_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / DONE).is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def save_checkpoint(run_dir: Path, step: int, models, trainer_state: dict, keep: int = 2) -> Path:
    root = _ckpt_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    models.policy.save_pretrained(tmp / "policy", safe_serialization=True)
    models.tokenizer.save_pretrained(tmp / "policy")
    if models.value is not None:
        models.value.save_pretrained(tmp / "value", safe_serialization=True)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    (tmp / DONE).write_text(str(step))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)


def rng_state(rng: random.Random) -> dict:
    state = {"python": rng.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, rng: random.Random) -> None:
    rng.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
