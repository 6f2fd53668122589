"""Run one VAPO rollout step of a run directory and dump rank 0's metrics and synced gradients.

Used by tests/test_distributed.py and tests/test_fsdp.py both as a plain process and under
`torchrun --nproc_per_node 2` (ddp or fsdp, as the run's config says).
"""
import json
import sys

import torch

from vapo_engine.trainer.fsdp import full_grads
from vapo_engine.trainer.loop import rollout_step
from vapo_engine.trainer.setup import build_trainer

run_dir, out = sys.argv[1], sys.argv[2]
tr = build_trainer(run_dir, write=False, log=lambda m: None)
metrics = rollout_step(tr)
grads, vgrads = full_grads(tr.models.policy), full_grads(tr.models.value)
if tr.world.is_main:
    torch.save({"metrics": metrics, "grads": grads, "vgrads": vgrads}, out)
tr.world.barrier()
from vapo_engine.trainer.distributed import shutdown

shutdown(tr.world)
print(json.dumps({"rank": tr.world.rank, "world": tr.world.world_size}))
