"""Where a rollout step's data comes from: `collect` (a phase's rollout with its old outputs, sampled ahead or
fresh, within the staleness bound) and `minibatches` (this rank's shuffled mini-batch rows). Split from
trainer/loop.py, which calls both."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import torch

from vapo_engine.rollout.experience import Rollout

from . import streams
from .first_forward import FirstForward, old_outputs, reuse_possible
from .offpolicy import policy_version, sample_step, step_prompts, within_bound
from .setup import Trainer


def collect(tr: Trainer, phase: str, index: int, ask_provider: bool = False
            ) -> tuple[Rollout, float, FirstForward | None]:
    """Rollout number `index` of `phase` ("policy" step or value-"pretrain" round) with its old outputs, the
    digest of its prompt list, and the kept forward pass of the first update's first micro-batch (None where
    not possible: first_forward.py). Every rank draws the same global prompt list (the phase's prompt stream
    at this index, trainer/streams.py) and samples its own slice of groups, so the global batch does not depend
    on the world size and a group never spans ranks. A rollout sampled ahead while the last update ran is used
    if there is one; a rollout sampled by weights older than allowed is sampled again (trainer/offpolicy.py).
    Value pretraining takes no policy outputs."""
    cfg = tr.cfg
    prompts = step_prompts(tr, phase, index)
    if ask_provider:  # policy steps only (not value pretraining); rank 0: answers arrive in the background
        tr.provider.submit(prompts)
    def fresh() -> Rollout:
        return sample_step(tr, tr.models, phase, index, prompts, policy_version(tr))
    ro = within_bound(tr, tr.prefetch.take(phase, index) or fresh(), fresh)
    policy = phase == "policy"
    epochs = cfg.training.ppo_epochs if policy else cfg.vapo.value_pretrain_epochs
    updates = policy and tr.step < cfg.training.total_steps or not policy and tr.uses_critic
    first_mini = next(minibatches(tr, ro.size, phase, index, epochs), None) \
        if updates and reuse_possible(cfg, tr.parallel.sharded) else None
    t0 = time.perf_counter()
    ro, first = old_outputs(tr.models, ro, cfg.micro_batch_size, first_mini, tr.spec, tr.parallel.max_int,
                            policy=policy)
    ro = replace(ro, old_seconds=time.perf_counter() - t0)
    return ro, streams.digest([q.prompt for q in prompts]), first


def minibatches(tr: Trainer, n: int, phase: str, index: int, epochs: int) -> Iterator[torch.Tensor]:
    """Row indices of this rank's mini-batches (its share of `mini_batch_size`) over `epochs` passes of `n`
    rows, each pass in a fresh order from the phase's shuffle stream."""
    size = tr.cfg.mini_batch_size // tr.parallel.size
    shuffle = streams.generator(tr.info.seed, "shuffle", phase, index, tr.parallel.rank)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=shuffle) if size < n else torch.arange(n)
        yield from (perm[s:s + size] for s in range(0, n, size))
