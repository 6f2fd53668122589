"""The trainer's side of a remote rollout backend (`rollout.backend` = server / vllm / sglang): keep the inference
servers' weights equal to the policy's, and tell the run directory when they cannot be reached.

`attach(tr)` is called once the trainer is built. For an in-process backend (`hf`) it returns a sync that does
nothing. Otherwise it pushes the current policy at once as version `tr.rollout_step` (a fresh replica's own
weights are never sampled from) and, after each rollout step (`after_step`, every `rollout.sync_every`, and
always before an evaluation), again with version = the rollout step: so rollout step k is sampled with version
k. A push writes the policy as a
plain Hugging Face safetensors directory (merged adapters; under fsdp gathered on rank 0, the checkpoint's
export) to a temporary name in `rollout.weights_dir` (default <run dir>/rollout_weights), renames it to
`v<version>` (atomic: a replica never reads a half-written directory), then has every replica load it
(`backend.load_weights`; the other ranks only learn the version) and deletes older versions. The backend's pool
reports waiting for / giving up on its replicas through `rollout.json` in the run directory (rank 0), which
run_status and diagnose_error read. This file does not sample and does not choose replicas.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from vapo_engine.rundir import ROLLOUT_JSON, ROLLOUT_WEIGHTS, RunDir

from .fsdp import export_hf
from .lora import save_plain


class NoSync:
    """The in-process backend samples from the live policy: nothing to push."""

    def after_step(self, tr) -> None:
        pass


class WeightSync:
    def __init__(self, tr, log):
        self.backend, self.log = tr.models.backend, log
        self.dir = Path(tr.cfg.rollout.weights_dir or Path(tr.info.run_dir) / ROLLOUT_WEIGHTS)
        self.every = tr.cfg.rollout.sync_every
        self.version: int | None = None
        self.last_step = tr.step
        self.backend.pool.log = log  # (a no-op on the other ranks)
        if tr.parallel.is_main:
            rd = RunDir(tr.info.run_dir)
            rd.write_json(ROLLOUT_JSON, {})
            self.backend.pool.on_status = lambda status: rd.write_json(
                ROLLOUT_JSON, {**(status or {}), "updated": time.time()})

    def after_step(self, tr) -> None:
        """Push after every `sync_every`-th rollout step, and before an evaluation (the loop evaluates after the
        step that crosses an `eval_interval` boundary, and at the end): evaluations always see the policy."""
        e = tr.cfg.eval.eval_interval
        evaluates = tr.step // e > self.last_step // e or tr.step >= tr.cfg.training.total_steps
        self.last_step = tr.step
        if tr.rollout_step % self.every == 0 or evaluates:
            self.push(tr, tr.rollout_step)

    def push(self, tr, version: int) -> None:
        """Write the policy as `version`, have every replica load it (see the module docstring)."""
        p, final = tr.parallel, self.dir / f"v{version:07d}"
        if p.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".tmp-v{version:07d}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
        if p.sharded:
            export_hf(tr.models.policy, tmp if p.is_main else None, p.is_main)  # collective
        elif p.is_main:
            save_plain(tr.models.policy, tmp)
        if p.is_main:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self.backend.load_weights(tr.models, version=version, path=str(final), send=True)
            for old in self.dir.glob("v*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
        p.world.barrier()
        if not p.is_main:
            self.backend.load_weights(tr.models, version=version, path=str(final), send=False)
        self.version = version


def attach(tr, log=print) -> NoSync | WeightSync:
    """The weight sync of `tr`'s rollout backend, with the current policy already pushed (see above)."""
    if not getattr(tr.models.backend, "remote", False):
        return NoSync()
    sync = WeightSync(tr, log if tr.parallel.is_main else (lambda m: None))
    sync.push(tr, tr.rollout_step)
    return sync
