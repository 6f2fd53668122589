"""One VAPO rollout step of each run directory given, and rank 0's metrics and synced gradients of each.

    python tests/dist_step.py RUN OUT.pt [RUN2 OUT2.pt ...] [--lock-step MODEL_DIR OUT_DIR]

Under `torchrun --nproc_per_node 2` every run is stepped in turn by the same two processes (ddp or fsdp, as
each run's config says; one process group for all), which costs one launch instead of one per run;
`--lock-step` then runs tests/fsdp_lockstep.py's check in the same processes. tests/test_fsdp.py calls `step`
in its own process for the one-process reference.

Teardown (`leave`): under fsdp the process group outlives `destroy_process_group` (DTensor's sharding caches
keep the device mesh, hence the group, alive), so it would be torn down during interpreter finalization, where a
gloo worker thread still releasing a collective's tensors needs the GIL, is ended by the finalizing interpreter,
and the rank aborts ("terminate called without an active exception", SIGABRT: seen once beside another test
under pytest-xdist; reproduced with queued collectives at exit). The ranks meet at a barrier, leave the group and
end without finalizing (`vapo_engine.trainer.distributed.end_rank`, as the trainer's ranks do).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root


def step(run_dir) -> tuple[object, dict]:
    """(This process's World, {"metrics", "grads", "vgrads"}) of one rollout step of `run_dir`; collective
    under torchrun (every rank calls it, in the same order)."""
    from vapo_engine.trainer.fsdp import full_grads
    from vapo_engine.trainer.loop import rollout_step
    from vapo_engine.trainer.setup import build_trainer
    tr = build_trainer(run_dir, write=False, log=lambda m: None)
    metrics = rollout_step(tr)
    return tr.world, {"metrics": metrics, "grads": full_grads(tr.models.policy),
                      "vgrads": full_grads(tr.models.value)}


def leave(world, message: str = "") -> None:
    """Meet the other ranks, leave the process group, print `message`, and end this process now (see above)."""
    from vapo_engine.trainer.distributed import end_rank, shutdown
    world.barrier()
    shutdown(world)
    print(message, end="\n" if message else "", flush=True)
    end_rank(0)


def main(argv: list[str]) -> None:
    import torch

    from vapo_engine.trainer.distributed import init_world
    lock = None
    if "--lock-step" in argv:
        i = argv.index("--lock-step")
        lock, argv = argv[i + 1:i + 3], argv[:i] + argv[i + 3:]
    world = init_world("gloo", "cpu")
    for run, out in zip(argv[0::2], argv[1::2]):
        world, res = step(run)
        if world.is_main:
            torch.save(res, out)
    if lock:
        from tests.fsdp_lockstep import lock_step
        lock_step(*lock, world)
    leave(world, json.dumps({"rank": world.rank, "world": world.world_size}))


if __name__ == "__main__":
    main(sys.argv[1:])
