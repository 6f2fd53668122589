"""Lock-step generation under FSDP2 (run by tests/test_fsdp.py under `torchrun --nproc_per_node 2`, through
tests/dist_step.py's `--lock-step` or as `fsdp_lockstep.py MODEL_DIR OUT_DIR`): rank 0's responses all end after
one token (its EOS is the first token it would write), rank 1's run much longer; both ranks must leave
`generate` and meet at the next collective. Writes each rank's response lengths to <out dir>/rank<N>.json."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root


def lock_step(model_dir, out_dir, world) -> None:
    import torch

    from vapo_engine.rollout.generate import _lock_step, generate, response_lengths
    from vapo_engine.trainer.fsdp import shard
    from vapo_engine.trainer.models import load_models
    models = load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                         device=torch.device("cpu"), autocast_dtype=None)
    shard(models.policy, torch.device("cpu"), bf16=False, cpu_offload=False)
    prompts = ["12+34=", "12+34="]
    with torch.no_grad():  # every rank runs this forward (a collective): the first greedy token of prompt 0
        ids = models.tokenizer(prompts[0], return_tensors="pt").input_ids
        first = int(models.policy(input_ids=ids).logits[0, -1].argmax())
    if world.rank == 0:
        models.policy.generation_config.eos_token_id = first
    gen = generate(models.policy, models.tokenizer, prompts, max_new_tokens=24, do_sample=False)
    world.barrier()
    lengths = response_lengths(gen.response_mask).tolist()
    result = {"rank": world.rank, "lock_step": _lock_step(models.policy), "lengths": lengths}
    (Path(out_dir) / f"rank{world.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    from tests.dist_step import leave
    from vapo_engine.trainer.distributed import init_world
    w = init_world("gloo", "cpu")
    lock_step(sys.argv[1], sys.argv[2], w)
    leave(w)
