"""How the processes of a run work together: one process, ddp (every rank holds the whole model) or fsdp (the
models are sharded with FSDP2). The recipe (loop.py) asks this object for everything that differs between the
three, so the recipe reads the same in all of them:

| concern | one process | ddp | fsdp |
|---|---|---|---|
| gradients | – | one SUM all-reduce per optimizer step | reduce-scattered by FSDP2 in the backward |
| saving | writes a plain checkpoint | rank 0 writes it, the others wait | every rank writes its shards |
| evaluation | evaluates | rank 0 evaluates, the others wait | every rank scores a slice |
| an optional forward (`lock_step`) | when it has one | when this rank has one | when any rank has one |
| stop vote | its own flag | any rank's flag | any rank's flag |
| metrics | as they are | combined per name by the catalogue's rule (`vapo_engine.metrics.COMBINE`) | the same |

Under fsdp every forward of a sharded model is a collective, so the ranks must run as many forwards as each
other (lock-step): evaluation runs on every rank, and token-budget micro-batching pads every rank to the busiest
rank's count (`max_int`) in all three. Replayed positives ride in the actor's micro-batches (update.py), so no
rank runs a pass the others skip. Every rank ends with rank 0's evaluation and the combined metrics.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vapo_engine.config import TrainConfig
from vapo_engine.metrics import MAX, MEAN, SUM, combine_rule
from vapo_engine.rollout.evaluate import Split

from .checkpoint import save_checkpoint
from .distributed import World, shutdown
from .fsdp import export_hf
from .lora import save_plain
from .sharded_checkpoint import save_sharded


@dataclass(frozen=True)
class Parallel:
    world: World = field(default_factory=World)
    sharded: bool = False
    """fsdp: the models are FSDP2 modules (only with more than one process)."""

    @classmethod
    def of(cls, cfg: TrainConfig, world: World) -> Parallel:
        return cls(world, sharded=cfg.distributed.strategy == "fsdp" and world.enabled)

    @property
    def kind(self) -> str:
        """"single", "ddp" or "fsdp"."""
        return "fsdp" if self.sharded else "ddp" if self.world.enabled else "single"

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.world_size

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor summed over ranks (counts, moments: what makes a statistic global)."""
        return self.world.sum(t)

    def max_int(self, n: int) -> int:
        """The largest `n` over ranks: the number of passes every rank runs (token-budget micro-batches)."""
        return self.world.max_int(n)

    def lock_step(self, mine: bool) -> bool:
        """Whether this rank must run an optional forward pass: when it has one to run (`mine`), or under fsdp when
        any rank has one (a rank with nothing to run then runs the pass on empty input, so the collectives match).
        No pass of the recipe is optional today — replayed positives ride in the actor's micro-batches — so only
        a new optional pass asks this."""
        return self.world.max_int(int(mine)) > 0 if self.sharded else mine

    def sync_gradients(self, model: torch.nn.Module | None) -> None:
        """SUM the gradients of `model` over ranks (ddp); FSDP2 already did in the backward."""
        if not self.sharded and model is not None:
            self.world.sync_gradients(model)

    def stop_vote(self, mine: bool) -> bool:
        """Whether any rank asks to stop (every rank stops together)."""
        return float(self.world.sum(torch.tensor([float(mine)]))) > 0

    def combine(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric combined over ranks by its rule in the catalogue (`vapo_engine.metrics.combine_rule`):
        mean, sum and max are all-reduced; `same` and `main` values are kept as they are. When the ranks
        disagree on the names, every value stays local."""
        if not self.world.enabled:
            return dict(metrics)
        rules = {k: combine_rule(k) for k in metrics}
        names = sorted(k for k, r in rules.items() if r in (MEAN, SUM, MAX))
        if not self.world.agree(names):
            return dict(metrics)
        out = dict(metrics)
        added = [k for k in names if rules[k] != MAX]
        if added:
            total = self.world.sum(torch.tensor([metrics[k] for k in added], dtype=torch.float64)).tolist()
            out |= {k: float(s / self.size if rules[k] == MEAN else s) for k, s in zip(added, total)}
        top = [k for k in names if rules[k] == MAX]
        if top:
            largest = self.world.max(torch.tensor([metrics[k] for k in top], dtype=torch.float64))
            out |= dict(zip(top, largest.tolist()))
        return out

    def evaluate(self, run: Callable[[Split | None], dict[str, float]]) -> dict[str, float]:
        """`run(None)` on rank 0 while the others wait, or under fsdp `run(split)` on every rank (a slice each);
        every rank returns rank 0's result."""
        m: dict[str, float] = {}
        if self.is_main or self.sharded:
            m = run(Split(self.rank, self.size, self.world.sum) if self.sharded else None)
        return self.world.broadcast_json(m)

    def save(self, run_dir: Path, step: int, models, opt_actor, opt_critic, trainer_state: dict) -> None:
        """A checkpoint of step `step`: written by rank 0 (every rank holds the full weights; the others wait),
        or under fsdp by every rank, its own shards (sharded_checkpoint)."""
        if self.sharded:
            save_sharded(run_dir, step, models, opt_actor, opt_critic, trainer_state, self.world)
            return
        if self.is_main:
            save_checkpoint(run_dir, step, models, trainer_state)
        self.world.barrier()

    def save_value_model(self, models, out: Path) -> None:
        """The trained value model as a plain HF directory (usable as `model.value_path`; LoRA adapters merged)
        with the tokenizer, written by rank 0; under fsdp the shards are gathered first (every rank calls this)."""
        if self.sharded:
            export_hf(models.value, out, self.is_main)
        elif self.is_main:
            save_plain(models.value, out)
        if self.is_main:
            models.tokenizer.save_pretrained(out)

    def shutdown(self) -> None:
        """Leave the process group (nothing for one process)."""
        shutdown(self.world)


ONE_PROCESS = Parallel()
"""One process: every collective is the identity."""
