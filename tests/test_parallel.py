"""`Parallel` without a process group: a two-rank world whose other rank is simulated, so each rule of how a
metric combines, the stop vote, the evaluation split and the lock-step pass can be checked on their own (the
real 2-process runs are tests/test_fsdp.py and tests/test_distributed.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vapo_engine.metrics import CATALOGUE, COMBINE, MAIN, MAX, MEAN, SAME, SUM, combine_rule
from vapo_engine.trainer.distributed import World
from vapo_engine.trainer.parallel import ONE_PROCESS, Parallel


@dataclass(frozen=True)
class TwoRanks(World):
    """Rank 0 of two. The other rank adds `other_sums` to a sum (else its `other_flag`: a vote, a count) and
    `other_max` to a max."""

    rank: int = 0
    world_size: int = 2
    other_sums: tuple[float, ...] = ()
    other_max: tuple[float, ...] = ()
    other_flag: int = 0

    def sum(self, t):
        return t + (torch.tensor(self.other_sums, dtype=t.dtype) if self.other_sums else self.other_flag)

    def max(self, t):
        return torch.maximum(t.double(), torch.tensor(self.other_max, dtype=torch.float64))

    def max_int(self, n):
        return max(n, self.other_flag)

    def agree(self, names):
        return True

    def broadcast_json(self, obj):
        return obj


def test_every_rule_is_named_in_the_catalogue_and_no_name_carries_a_rule():
    assert set(COMBINE) <= set(CATALOGUE)
    assert set(COMBINE.values()) <= {MEAN, SUM, MAX, SAME, MAIN}
    assert not [n for n in CATALOGUE if n.endswith("_sum")]  # how a metric combines is not in its name
    assert combine_rule("actor/pg_loss") == SUM and combine_rule("rollout/reward_mean") == MEAN
    assert combine_rule("actor/ratio_max") == MAX and combine_rule("provider/ok") == MAIN
    assert combine_rule("critic/pretrain_explained_var") == SAME


def test_combine_applies_each_rule():
    mine = {"actor/pg_loss": 0.25, "rollout/reward_mean": 0.5, "actor/entropy": 0.7, "provider/ok": 3.0,
            "actor/ratio_max": 1.25}
    # the other rank's actor/pg_loss and rollout/reward_mean (summed and averaged names go sorted), its ratio_max
    out = Parallel(TwoRanks(other_sums=(0.5, 1.0), other_max=(2.0,))).combine(mine)
    assert out == {"actor/pg_loss": 0.75, "rollout/reward_mean": 0.75, "actor/entropy": 0.7, "provider/ok": 3.0,
                   "actor/ratio_max": 2.0}
    assert list(out) == list(mine)  # the caller's order is kept
    assert ONE_PROCESS.combine(mine) == mine


def test_stop_vote_is_any_rank():
    assert Parallel(TwoRanks(other_flag=1)).stop_vote(False)
    assert not Parallel(TwoRanks()).stop_vote(False)
    assert ONE_PROCESS.stop_vote(True) and not ONE_PROCESS.stop_vote(False)


@pytest.mark.parametrize("sharded", [False, True])
def test_evaluation_split_and_lock_step_follow_the_strategy(sharded):
    p = Parallel(TwoRanks(other_flag=1), sharded=sharded)
    assert p.kind == ("fsdp" if sharded else "ddp")
    seen = []
    assert p.evaluate(lambda split: seen.append(split) or {"eval/greedy_accuracy": 1.0}) == \
        {"eval/greedy_accuracy": 1.0}
    assert (seen[0] is not None) == sharded  # fsdp: every rank scores its slice; ddp: rank 0 all of it
    if sharded:
        assert (seen[0].rank, seen[0].size) == (0, 2)
    # the other rank has replayed rows and this one has none: only fsdp makes this rank run the pass too
    assert p.lock_step(False) == sharded and p.lock_step(True)
    off_main = Parallel(TwoRanks(rank=1), sharded=sharded)
    seen.clear()
    off_main.evaluate(lambda split: seen.append(split) or {})
    assert len(seen) == int(sharded)  # a ddp rank other than 0 waits for rank 0's result


def test_one_process_and_strategy_from_the_config():
    from vapo_engine.config import TrainConfig
    assert ONE_PROCESS.kind == "single" and not ONE_PROCESS.lock_step(False) and ONE_PROCESS.max_int(3) == 3
    fsdp = TrainConfig.model_validate({"distributed": {"strategy": "fsdp"}})
    assert Parallel.of(fsdp, TwoRanks()).kind == "fsdp"
    assert Parallel.of(fsdp, World()).kind == "single"  # fsdp needs more than one process
    assert Parallel.of(TrainConfig(), TwoRanks()).kind == "ddp"
