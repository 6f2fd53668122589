"""One VAPO rollout step of a LoRA run directory, rewarded by `ParityReward` so that an untrained model's
policy gets a gradient; dumps rank 0's metrics and synced gradients (tests/test_lora.py runs it as a plain
process and under `torchrun --nproc_per_node 2`, as tests/dist_step.py does for full fine-tuning)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
from bench.lib.runs import reward_parity


def main(run_dir: str, out: str):
    """The step; returns this process's World (tests/test_lora.py calls it in its own process too)."""
    import torch

    from vapo_engine.trainer.loop import rollout_step
    from vapo_engine.trainer.setup import build_trainer
    tr = build_trainer(run_dir, write=False, log=lambda m: None)
    reward_parity(tr)
    metrics = rollout_step(tr)
    grads = (lambda m: torch.cat([p.grad.reshape(-1) for p in m.parameters() if p.grad is not None]))
    if tr.world.is_main:
        torch.save({"metrics": metrics, "grads": grads(tr.models.policy), "vgrads": grads(tr.models.value)},
                   out)
    return tr.world


if __name__ == "__main__":
    from tests.dist_step import leave
    leave(main(sys.argv[1], sys.argv[2]))  # barrier, destroy, exit without finalizing (tests/dist_step.py)
