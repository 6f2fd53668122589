"""LoRA in the trainer (config [lora], `vapo_engine/config/lora_model.py`), built on peft.

- `attach_adapters`: LoRA adapters on the policy (only they train); on the value model's trunk plus its full
  scalar head when `lora.value_lora` (else the value model trains in full). The KL reference becomes
  `FrozenBase(policy)`: the same model run under peft's `disable_adapter()`, i.e. exactly the frozen initial
  weights, so no second copy is loaded.
- Checkpoint layout with LoRA (`checkpoint.save_checkpoint`): `policy/` is always a plain, merged Hugging
  Face directory (W + scale·B·A, computed out of place so the live base weights never change), which
  `from_pretrained`, `serve-model` and `vapo-mcp eval` load as they are; `policy_adapter/` and
  `value_adapter/` (peft's format: adapter_config.json + adapter_model.safetensors, the value head included)
  are what resume loads on top of the base model. A value model trained in full stays in `value/`.
- `trainable`: the parameters an optimizer gets. `adapter_dropout`: LoRA dropout in the update passes only.

peft is imported lazily (`require_peft`): a run without LoRA never needs it. This file trains nothing.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from vapo_engine.config.lora_model import ALL_LINEAR, INSTALL_HINT, LoraConfig

from .models import ModelLoadError, Models

POLICY_ADAPTER, VALUE_ADAPTER = "policy_adapter", "value_adapter"
"""Checkpoint sub-folders of the adapters (peft format)."""
HEAD_NAMES = ("score", "classifier")
"""Attribute names of a token-classification value model's scalar head (trained in full, never adapted)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def require_peft():
    """The peft module, or a clear error saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ModelLoadError(f"lora.enabled = true needs the peft package: {INSTALL_HINT}") from None
    return peft


def is_adapted(model) -> bool:
    """Whether `model` carries peft adapters (never imports peft: only a loaded peft can have made them)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that train: every one without LoRA; adapters (+ value head) with it."""
    return [p for p in model.parameters() if p.requires_grad]


class FrozenBase:
    """The policy with its adapters switched off, standing in for a separate reference model
    (`Models.reference`): called like a model, it runs the policy under peft's `disable_adapter()`."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, **inputs):
        with self.policy.disable_adapter():
            return self.policy(**inputs)


def describe(models: Models) -> str:
    """One line for the run's log: what trains, out of how much."""
    def part(name: str, model) -> str:
        n, k = sum(p.numel() for p in model.parameters()), sum(p.numel() for p in trainable(model))
        return f"{name} trains {k:,} of {n:,} parameters ({100 * k / max(n, 1):.2f}%)"
    parts = [part("policy", models.policy)]
    if models.value is not None:
        parts.append(part("value model", models.value))
    ref = "the policy with adapters off" if isinstance(models.reference, FrozenBase) else "none (kl_coef = 0)"
    return f"LoRA: {'; '.join(parts)}; KL reference: {ref}"


def attach_adapters(models: Models, lora: LoraConfig, *, ckpt: Path | None, kl: bool) -> Models:
    """`models` with LoRA on the policy (and the value trunk when `lora.value_lora`), adapter weights restored
    from checkpoint folder `ckpt` when given, and the frozen base as the reference when `kl`."""
    peft = require_peft()
    policy = _adapt(peft, models.policy, lora, heads=[])
    value = models.value
    if value is not None and lora.value_lora:
        value = _adapt(peft, value, lora, heads=[h for h in HEAD_NAMES if hasattr(value, h)])
    if ckpt is not None:
        load_adapter(policy, ckpt / POLICY_ADAPTER)
        if is_adapted(value):
            load_adapter(value, ckpt / VALUE_ADAPTER)
    for m in (policy, value):
        if m is not None:
            m.eval()  # as every model of a run: no dropout outside `adapter_dropout`
    return replace(models, policy=policy, value=value, reference=FrozenBase(policy) if kl else None)


def _adapt(peft, model, lora: LoraConfig, heads: list[str]):
    excluded = [model.get_output_embeddings(), *(getattr(model, h) for h in heads)]
    cfg = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                          target_modules=target_names(model, lora.target_modules, excluded),
                          use_rslora=lora.use_rslora, modules_to_save=heads or None,
                          task_type="CAUSAL_LM" if not heads else None)
    with warnings.catch_warnings():  # peft calls a method transformers 5 deprecates: noise in worker.log
        warnings.simplefilter("ignore", FutureWarning)
        return peft.get_peft_model(model, cfg)


def target_names(model: torch.nn.Module, wanted: list[str], excluded: list) -> list[str]:
    """peft `target_modules` for `model`: ["all-linear"] resolves to the leaf names of every linear layer
    except `excluded` (LM head, value head; a leaf name those share is replaced by full paths); listed names
    must each match a module (a name matches a module whose path ends with it)."""
    from transformers.pytorch_utils import Conv1D
    skip = {id(sub) for m in excluded if m is not None for sub in m.modules()}  # a head's own layers too
    names = [n for n, m in model.named_modules() if n]
    linear = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))]
    if wanted != [ALL_LINEAR]:
        missing = [t for t in wanted if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in linear})
            raise ModelLoadError(f"lora.target_modules names {missing} but the model has no such module; its "
                                 f"linear layers are {leaves} (or use [\"{ALL_LINEAR}\"])")
        heads = [n for n, m in model.named_modules() if id(m) in skip]
        hit = [t for t in wanted for n in heads if n == t or n.endswith("." + t)]
        if hit:
            raise ModelLoadError(f"lora.target_modules names {hit[0]!r}, the output head (the LM head, tied "
                                 "to the embeddings in many models, or the value head, which trains in full "
                                 "anyway); drop it from the list")
        return list(wanted)
    linear_set = set(linear)
    keep = [n for n, m in model.named_modules() if n in linear_set and id(m) not in skip]
    dropped = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if id(m) in skip}
    leaves = {n.rsplit(".", 1)[-1] for n in keep}
    out = sorted(leaves - dropped) + sorted(n for n in keep if n.rsplit(".", 1)[-1] in dropped)
    if not out:
        raise ModelLoadError(f"lora.target_modules = [\"{ALL_LINEAR}\"] found no linear layer in the model; "
                             "list the layers to adapt by name")
    return out


def load_adapter(model, folder: Path) -> None:
    """Adapter weights (and value head) of a checkpoint into `model`, whose adapters are already in place;
    the file must hold exactly the adapter tensors the model has (else the checkpoint is unusable: why)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file
    path = folder / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ModelLoadError(f"{folder.name}/{ADAPTER_WEIGHTS} is missing")
    device = next(model.parameters()).device
    weights = load_file(str(path), device=str(device))
    expected = set(get_peft_model_state_dict(model))
    if set(weights) != expected:
        diff = sorted(expected ^ set(weights))[:3]
        raise ModelLoadError(f"{folder.name} does not match the [lora] settings of this run (e.g. {diff})")
    set_peft_model_state_dict(model, weights)


def save_adapter(model, folder: Path) -> None:
    """The adapters (and a value head) in peft's format: adapter_config.json + adapter_model.safetensors."""
    model.save_pretrained(str(folder), safe_serialization=True, save_embedding_layers=False)


def save_plain(model, folder: Path) -> None:
    """`model` as a plain Hugging Face directory; adapters are folded into the weights (a merged copy)."""
    if not is_adapted(model):
        model.save_pretrained(folder, safe_serialization=True)
        return
    base = model.get_base_model()
    base.save_pretrained(folder, state_dict=merged_state_dict(model), safe_serialization=True)


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The state dict of the plain model that `model` (a PeftModel) computes: W + ΔW for every adapted layer,
    the trained copy of each saved module (value head), original key names. Live weights are not touched;
    merged tensors go to the CPU one at a time, so the device holds at most one extra layer."""
    from peft.tuners.lora import LoraLayer
    adapter = model.active_adapter
    base = model.get_base_model()
    layers = {f"{n}.base_layer.weight": m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    out = {}
    for key, t in base.state_dict().items():
        if ".lora_" in key or ".original_module." in key:
            continue
        name = key.replace(".base_layer.", ".").replace(f".modules_to_save.{adapter}.", ".")
        out[name] = (t + layers[key].get_delta_weight(adapter).to(t.dtype)).cpu() if key in layers else t
    return out


@contextmanager
def adapter_dropout(*models) -> Iterator[None]:
    """LoRA dropout on (train mode) inside the block, for the update passes; other passes run without it."""
    with ExitStack() as stack:
        for model in models:
            if model is None or not is_adapted(model):
                continue
            drops = [m for n, m in model.named_modules() if ".lora_dropout." in f".{n}." and
                     isinstance(m, torch.nn.Dropout)]
            for d in drops:
                d.train()
            stack.callback(lambda ds=drops: [d.eval() for d in ds])
        yield
