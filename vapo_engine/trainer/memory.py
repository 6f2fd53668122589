"""Memory options of the update passes (config [training]: `gradient_checkpointing`, `micro_batch_tokens`).

- `apply_memory_options(models, cfg)`: Hugging Face activation checkpointing (non-reentrant) on the models that
  train — the policy and the value model, through peft's wrapper with LoRA — when gradient_checkpointing is on.
- `checkpointing(*models)`: the context of the update passes. Every model of a run stays in eval mode (no
  dropout, so old and new log-probs agree exactly), but transformers only checkpoints a layer whose own
  `.training` is True; inside the block exactly the checkpointed layers (`GradientCheckpointingLayer`) are
  in train mode — not their children, so attention dropout and the like stay off — and everything is
  restored after. `apply_memory_options` checks once that train mode on those layers changes no output.
- `token_budget_split` / `split_to_count`: micro-batches by a token budget (pure functions on response
  lengths), and the extra splits that give every rank the same number of forward passes (FSDP lock-step).

Does not run the update (trainer/update.py) and does not choose devices or load models (trainer/setup.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vapo_engine.config import TrainConfig

from .lora import is_adapted
from .models import ModelLoadError, Models

NOT_PREPARED = ("training.gradient_checkpointing = true but the {name} has no checkpointed layer: call "
                "vapo_engine.trainer.memory.apply_memory_options(models, cfg) where the models are built")


def apply_memory_options(models: Models, cfg: TrainConfig) -> Models:
    """Turn on activation checkpointing on the policy and the value model when
    `training.gradient_checkpointing`; nothing otherwise. Changes the models in place (returned for chaining).
    Call it after LoRA adapters are attached and before the models are sharded or broadcast."""
    if cfg.training.gradient_checkpointing:
        for name, model in (("policy", models.policy), ("value model", models.value)):
            if model is not None:
                enable_checkpointing(model, name)
    return models


def enable_checkpointing(model: torch.nn.Module, name: str = "model") -> None:
    """Non-reentrant activation checkpointing on every decoder layer of `model` (a PeftModel: its base
    model), refused with the fix when the architecture cannot do it or its layers act differently in train
    mode (dropout inside the layer itself would break the exact old/new log-prob agreement)."""
    hf = model.get_base_model() if is_adapted(model) else model
    if not getattr(hf, "supports_gradient_checkpointing", False):
        raise ModelLoadError(f"training.gradient_checkpointing = true but the {name} ({type(hf).__name__}) does "
                             "not support activation checkpointing; set training.gradient_checkpointing = false "
                             "and save memory with training.micro_batch_tokens or a smaller micro_batch_size")
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers 5's name; the old one is deprecated
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if not checkpointed_layers(model):
        raise ModelLoadError(f"training.gradient_checkpointing = true but the {name} ({type(hf).__name__}) has "
                             "no GradientCheckpointingLayer the trainer can switch on; set "
                             "training.gradient_checkpointing = false")
    _check_train_mode_is_inert(model, name)


def checkpointed_layers(model: torch.nn.Module | None) -> list[torch.nn.Module]:
    """The layers of `model` that checkpoint once in train mode (none for a model without checkpointing)."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    if model is None:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextmanager
def checkpointing(*models: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block the checkpointed layers of `models` (None entries skipped) are in train mode, so
    transformers recomputes their activations in the backward pass; their children and the rest of each
    model keep their mode. Raises when a given model has no checkpointed layer (not prepared)."""
    layers = []
    for model in models:
        found = checkpointed_layers(model)
        if model is not None and not found:
            raise RuntimeError(NOT_PREPARED.format(name=type(model).__name__))
        layers += found
    before = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, mode in zip(layers, before):
            layer.training = mode


@torch.no_grad()
def _check_train_mode_is_inert(model: torch.nn.Module, name: str) -> None:
    """One tiny forward with the checkpointed layers in eval and in train mode (no gradients, so nothing is
    checkpointed); the outputs must agree, or the layers hold train-mode behaviour of their own."""
    emb = model.get_input_embeddings()
    device = emb.weight.device
    ids = (torch.arange(8, device=device) % emb.num_embeddings).unsqueeze(0)
    probe = (lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float())
    eval_out = probe()
    with checkpointing(model):
        train_out = probe()
    if not torch.allclose(eval_out, train_out, rtol=1e-4, atol=1e-5):
        raise ModelLoadError(f"training.gradient_checkpointing = true but the {name}'s decoder layers compute "
                             "differently in train mode (dropout inside the layer): checkpointing needs them "
                             "in train mode, which would make new log-probs differ from old ones; set the "
                             "model's dropout to 0 in its config.json, or training.gradient_checkpointing = false")


def token_budget_split(lengths: torch.Tensor, prompt_len: int, budget: int,
                       max_rows: int | None = None) -> list[torch.Tensor]:
    """Micro-batches of row indices whose rows × (prompt_len + longest response among them) ≤ `budget`, with
    at most `max_rows` rows each. Rows go longest first (stable sort), so micro-batches hold similar lengths
    and little padding; a row over the budget alone is a micro-batch of its own. An empty response counts
    as one column (`Rollout.trimmed` keeps one). lengths (N,) → LongTensors (CPU) covering 0…N−1 once each."""
    order = torch.sort(lengths.detach().cpu(), descending=True, stable=True).indices
    widths = (prompt_len + lengths.detach().cpu().clamp(min=1)[order]).tolist()
    cap = max_rows or len(widths)
    parts, start = [], 0
    for i in range(1, len(widths)):
        rows = i - start + 1
        if rows > cap or rows * widths[start] > budget:  # widths[start] is the group's longest
            parts.append(order[start:i])
            start = i
    if len(widths):
        parts.append(order[start:])
    return parts


def split_to_count(parts: list[torch.Tensor], k: int, lengths: torch.Tensor, prompt_len: int) -> list[torch.Tensor]:
    """`parts` (from `token_budget_split`) split further until there are exactly `k`: each time the costliest
    micro-batch (rows × padded width) with ≥ 2 rows is halved, its longer rows first. Every rank holds as many
    rows as the others, so a `k` that is the largest count over ranks never exceeds the rows here."""
    rows = sum(len(p) for p in parts)
    if not len(parts) <= k <= rows:
        raise ValueError(f"cannot make {k} micro-batches out of {len(parts)} holding {rows} rows")
    lengths = lengths.detach().cpu().clamp(min=1)
    parts = list(parts)
    while len(parts) < k:
        cost = [len(p) * (prompt_len + int(lengths[p].max())) if len(p) > 1 else -1 for p in parts]
        i = max(range(len(parts)), key=cost.__getitem__)
        half = (len(parts[i]) + 1) // 2
        parts[i:i + 1] = [parts[i][:half], parts[i][half:]]
    return parts
