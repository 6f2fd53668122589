"""FSDP2 (`distributed.strategy = "fsdp"`): the run's models sharded with PyTorch's `fully_shard`.

- `shard_models`: every transformer block (the classes a Hugging Face model lists in `_no_split_modules`) and
  then the whole model become FSDP2 units over a 1-D mesh of all ranks, for the policy, the value model and
  the frozen reference. Each rank keeps 1/world_size of every parameter, gradient and AdamW state; a block's
  full weights exist only during its forward/backward. On CUDA with bf16 the parameters are cast to bf16 for
  compute and gradients are reduced in fp32 (`MixedPrecisionPolicy`); `distributed.cpu_offload` keeps the
  shards in CPU memory (`CPUOffloadPolicy`).
- Gradients are SUMMED over ranks, not averaged (`set_gradient_divide_factor(1)`): the losses are already
  divided by the global token/sequence counts (update.py), exactly as under DDP, so FSDP2 step == DDP step.
- Lock-step: every forward of a sharded model is a collective. Generation passes `synced_gpus` (finished ranks
  keep decoding on padding until every rank is done); callers keep the number of forwards equal on every rank
  (`parallel.Parallel`: evaluation on every rank, the replay pass padded with weight 0).
- `full_state_dict`: the unsharded weights, gathered on rank 0 (CPU), for the plain HF export.

Loading models, checkpoints and the loop live elsewhere (models.py, sharded_checkpoint.py, parallel.py, loop.py).
"""
from __future__ import annotations

import torch


def is_sharded(model) -> bool:
    """Whether `model` was sharded with `fully_shard` (an FSDP2 module)."""
    if model is None:
        return False
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def block_classes(model: torch.nn.Module) -> set[type]:
    """The transformer-block classes of a Hugging Face model (its `_no_split_modules`), found by name."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        raise ValueError(f"{type(model).__name__} names no transformer block class (_no_split_modules is "
                         f"{sorted(names) or 'empty'}); strategy = \"fsdp\" needs one to shard per block")
    return found


def shard(model: torch.nn.Module, device: torch.device, *, bf16: bool, cpu_offload: bool) -> torch.nn.Module:
    """`fully_shard` each block, then the root (embeddings, norm, head), over all ranks; returns the model
    (the same object, now an FSDP module) with gradient SUM across ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    kwargs = {"mesh": mesh}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks = tuple(block_classes(model))
    for module in list(model.modules()):
        if isinstance(module, blocks):
            fully_shard(module, **kwargs)
    for module in _untied_embeddings(model):  # else the root unit keeps them whole from forward to backward
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    for module in model.modules():
        if is_sharded(module):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model


def _untied_embeddings(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The input embedding and the LM head as units of their own when they share no weight (tied ones stay
    in the root unit together); at 7B they are ~1B parameters the root would otherwise hold unsharded."""
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if inp is None or out is None or getattr(out, "weight", None) is getattr(inp, "weight", None):
        return [m for m in (inp,) if m is not None and out is None]
    return [inp, out]


def shard_models(models, world, cpu_offload: bool = False):
    """Shard the policy, value and reference model of `models` (a `models.Models`) in place; returns it.
    The models may be on CPU: `fully_shard` moves each rank's shards to the mesh device."""
    bf16 = models.device.type == "cuda" and models.autocast_dtype == torch.bfloat16
    for name in ("policy", "value", "reference"):
        m = getattr(models, name)
        if isinstance(m, torch.nn.Module):
            shard(m, models.device, bf16=bf16, cpu_offload=cpu_offload)
    return models


def local_norm(total) -> float:
    """A gradient norm as a float: the full value of a DTensor (sharded gradients), else the tensor itself."""
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


def full_grads(model: torch.nn.Module) -> torch.Tensor:
    """Every gradient of `model`, flattened into one fp32 CPU vector; sharded gradients are gathered first (a
    collective under fsdp: call on every rank). For parity checks (tests, scripts/gpu_check.py)."""
    gs = [p.grad for p in model.parameters() if p.grad is not None]
    if not gs:
        return torch.zeros(0)
    return torch.cat([(g.full_tensor() if hasattr(g, "full_tensor") else g).reshape(-1).float().cpu() for g in gs])


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on CPU, on rank 0 (an empty dict on the others). Collective: call on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export_hf(model: torch.nn.Module, folder, is_main: bool) -> None:
    """Collective: gather the full weights and write them on rank 0 as a plain HF directory (transformers strips
    the FSDP class prefix from `architectures`, so `from_pretrained` loads it like any checkpoint)."""
    weights = full_state_dict(model)
    if is_main:
        model.save_pretrained(folder, state_dict=weights, safe_serialization=True)


def load_full_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, saved: dict) -> None:
    """Load an optimizer state written unsharded (`opt.state_dict()` of a ddp / one-process run, parameters by
    index) into the optimizer of a sharded model: the indices become parameter names, then torch shards it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {names[int(i)]: v for i, v in saved["state"].items()}
    groups = [dict(g, params=[names[int(i)] for i in g["params"]]) for g in saved["param_groups"]]
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))
