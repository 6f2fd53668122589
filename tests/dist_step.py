"""Run one VAPO rollout step of a run directory and dump rank 0's metrics and synced gradients.

Used by tests/test_distributed.py both as a plain process and under `torchrun --nproc_per_node 2`.
"""
import json
import sys

import torch

from vapo_engine.trainer.loop import rollout_step
from vapo_engine.trainer.setup import build_trainer

run_dir, out = sys.argv[1], sys.argv[2]
tr = build_trainer(run_dir, write=False, log=lambda m: None)
metrics = rollout_step(tr)
grads = torch.cat([p.grad.reshape(-1) for p in tr.models.policy.parameters() if p.grad is not None])
vgrads = torch.cat([p.grad.reshape(-1) for p in tr.models.value.parameters() if p.grad is not None])
if tr.world.is_main:
    torch.save({"metrics": metrics, "grads": grads, "vgrads": vgrads}, out)
tr.world.barrier()
from vapo_engine.trainer.distributed import shutdown

shutdown(tr.world)
print(json.dumps({"rank": tr.world.rank, "world": tr.world.world_size}))
