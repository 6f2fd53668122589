"""Checkpoints that cannot lie and cannot run code: HF-format weights (safetensors) + trainer state
(safetensors + JSON, see state_io), written to a temporary folder, the DONE manifest last (sizes and
checksums of every file, `vapo_engine.rundir.write_manifest`), then renamed into `checkpoints/step-NNNNNNN/`.

Resume takes the newest checkpoint that verifies *and* loads; a damaged one (missing or truncated file, DONE
present) is named and skipped, and the previous complete one is used. Keeps the newest `keep` checkpoints.
Trainer state = optimizers, schedulers, RNG streams (torch, CUDA, the task/replay `random.Random`), replay
buffer, counters.

Layout: `policy/` is always a plain HF directory (+ tokenizer) that `from_pretrained`, `serve-model` and eval load;
`value/` the full value model. With [lora], `policy/` holds the merged weights and the adapters go beside it,
`policy_adapter/` and (value_lora) `value_adapter/` with the value head, in peft's format: resume loads those on
the base model (`lora.py`).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from vapo_engine.errors import UserError
from vapo_engine.rundir import RunDir, write_manifest

from .lora import POLICY_ADAPTER, VALUE_ADAPTER, is_adapted, save_adapter, save_plain
from .state_io import load_state, save_state


class NoUsableCheckpoint(UserError):
    """Every checkpoint of the run is damaged (or there is none); the message names each and why."""


def save_checkpoint(run_dir: Path, step: int, models, trainer_state: dict, keep: int = 2) -> Path:
    """Rank 0 alone (every rank holds the full weights): write, verify-manifest and publish the checkpoint."""
    tmp = new_tmp(run_dir, step, f"{os.getpid()}")
    save_plain(models.policy, tmp / "policy")
    models.tokenizer.save_pretrained(tmp / "policy")
    if is_adapted(models.policy):
        save_adapter(models.policy, tmp / POLICY_ADAPTER)
    if is_adapted(models.value):
        save_adapter(models.value, tmp / VALUE_ADAPTER)
    elif models.value is not None:
        models.value.save_pretrained(tmp / "value", safe_serialization=True)
    return publish(run_dir, tmp, step, trainer_state, keep)


def new_tmp(run_dir: Path, step: int, tag: str) -> Path:
    """An empty temporary folder beside the checkpoints for writing step `step`."""
    rd = RunDir(run_dir)
    rd.checkpoints.mkdir(parents=True, exist_ok=True)
    tmp = rd.checkpoints / f".tmp-step-{step:07d}-{tag}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def publish(run_dir: Path, tmp: Path, step: int, trainer_state: dict, keep: int) -> Path:
    """Trainer state and the DONE manifest into `tmp` (written last), rename it into place, keep the newest
    `keep` complete checkpoints."""
    rd = RunDir(run_dir)
    final = rd.checkpoint(step)
    save_state(trainer_state, tmp)
    write_manifest(tmp, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    ok, _ = rd.usable_checkpoints()
    for old in ok[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_newest(run_dir: Path, load: Callable[[Path, dict], object], log=print):
    """Call `load(checkpoint, trainer_state)` on the newest checkpoint that verifies and loads, falling back
    to older ones; returns (checkpoint, load's result). Raises `NoUsableCheckpoint` naming every damaged one."""
    ok, broken = RunDir(run_dir).usable_checkpoints()
    skipped = [f"{p.name} ({why})" for p, why in broken]
    for ckpt in ok:
        try:
            result = load(ckpt, load_state(ckpt))
        except Exception as e:  # noqa: BLE001 - any failure to load makes this checkpoint unusable; say why
            skipped.append(f"{ckpt.name} (cannot be loaded: {type(e).__name__}: {str(e)[:200]})")
            continue
        if skipped:
            log(f"skipped damaged checkpoint(s): {'; '.join(skipped)}; resumed from {ckpt.name} instead")
        return ckpt, result
    if not skipped:
        raise NoUsableCheckpoint(f"run directory {run_dir} has no complete checkpoint to resume from; "
                                 "start the run again (start_training / vapo-mcp train)")
    raise NoUsableCheckpoint(f"no usable checkpoint in {run_dir}: {'; '.join(skipped)}; start the run again "
                             "(start_training / vapo-mcp train), or restore the damaged files")

