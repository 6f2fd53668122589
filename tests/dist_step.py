"""Run one VAPO rollout step of a run directory and dump rank 0's metrics and synced gradients.

Used by tests/test_distributed.py and tests/test_fsdp.py both as a plain process and under
`torchrun --nproc_per_node 2` (ddp or fsdp, as the run's config says).
"""
import json
import sys

import torch

from vapo_engine.trainer.loop import rollout_step
from vapo_engine.trainer.setup import build_trainer

run_dir, out = sys.argv[1], sys.argv[2]
tr = build_trainer(run_dir, write=False, log=lambda m: None)
metrics = rollout_step(tr)


def flat_grads(model) -> torch.Tensor:
    """Every gradient, flattened; sharded (fsdp) gradients gathered to full tensors (a collective)."""
    gs = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.cat([(g.full_tensor() if hasattr(g, "full_tensor") else g).reshape(-1) for g in gs])


grads, vgrads = flat_grads(tr.models.policy), flat_grads(tr.models.value)
if tr.world.is_main:
    torch.save({"metrics": metrics, "grads": grads, "vgrads": vgrads}, out)
tr.world.barrier()
from vapo_engine.trainer.distributed import shutdown

shutdown(tr.world)
print(json.dumps({"rank": tr.world.rank, "world": tr.world.world_size}))
