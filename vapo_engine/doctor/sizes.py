"""Model sizes without weights: parameter counts from a model directory's config.json, and the measured bytes
per parameter of each strategy (bench/results/memory.json).

Llama-shaped architectures (qwen2, qwen3, llama, mistral) are counted with their formula from config.json alone
(exact for Qwen2.5-7B and -32B: the counts bench/perf/memory.py takes on the meta device). Any other
architecture is built on torch's meta device (no weights, no memory) when torch and transformers are installed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

MEMORY_RECORD = Path(__file__).resolve().parents[2] / "bench" / "results" / "memory.json"
"""The measured memory record (`python -m bench.perf.memory`); absent from an installed package."""
FALLBACK_BPP = 16.0
"""Bytes per trained parameter when the record is absent: fp32 weights (4) + gradients (4) + AdamW states (8)."""
LLAMA_SHAPED = {"qwen2", "qwen3", "llama", "mistral"}


@dataclass(frozen=True)
class Shape:
    """What memory and disk depend on: the policy's and value model's parameter counts and the trunk linears."""

    policy: int
    value: int
    """Trunk + a scalar head (the value model, `AutoModelForTokenClassification` with one label)."""
    value_head: int
    """The value model's scalar head (hidden + 1): trained in full under LoRA."""
    linears: tuple[tuple[str, int, int], ...]
    """(name, in, out) of every linear of the trunk (all layers), for LoRA adapter counts."""
    source: str

    def adapters(self, r: int, targets: list[str]) -> int:
        """LoRA adapter parameters of one model: r × (in + out) of every targeted trunk linear."""
        every = "all-linear" in targets
        return sum(r * (i + o) for name, i, o in self.linears if every or any(name.endswith(t) for t in targets))


def read_shape(model_dir: Path) -> Shape:
    """The shape of the causal LM in `model_dir` (config.json only; never the weights). ValueError when the
    config cannot be read or counted."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_dir / 'config.json'} cannot be read ({type(e).__name__})") from None
    if isinstance(cfg, dict) and cfg.get("model_type") in LLAMA_SHAPED:
        return _llama_shape(cfg)
    return _meta_shape(model_dir)


def _llama_shape(c: dict) -> Shape:
    h, layers, inter, vocab = (int(c[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                    "vocab_size"))
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    q, k = heads * hd, kv * hd
    bias = bool(c.get("attention_bias", c.get("model_type") == "qwen2"))
    norms = 2 * hd if c.get("model_type") == "qwen3" else 0
    one = [("q_proj", h, q), ("k_proj", h, k), ("v_proj", h, k), ("o_proj", q, h),
           ("gate_proj", h, inter), ("up_proj", h, inter), ("down_proj", inter, h)]
    layer = sum(i * o for _, i, o in one) + (q + 2 * k if bias else 0) + 2 * h + norms
    embed = vocab * h
    tied = bool(c.get("tie_word_embeddings", False))
    trunk = embed + layers * layer + h
    return Shape(policy=trunk + (0 if tied else embed), value=trunk + h + 1, value_head=h + 1,
                 linears=tuple(one * layers),
                 source=f"config.json ({c.get('model_type')} formula)")


def _meta_shape(model_dir: Path) -> Shape:
    """Build the model on the meta device (no weights) and count."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from vapo_engine.rollout.tokenizer import NO_REMOTE_CODE, refuse_remote_code
    except ImportError as e:
        raise ValueError(f"counting this architecture needs torch and transformers ({e})") from None
    refuse_remote_code(model_dir)
    config = AutoConfig.from_pretrained(model_dir, **NO_REMOTE_CODE)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **NO_REMOTE_CODE)
    policy = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    trunk = policy - (0 if tied or head is None else head.weight.numel())
    h = int(getattr(config, "hidden_size", 0) or 0)
    linears = tuple((n.rsplit(".", 1)[-1], m.in_features, m.out_features) for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and m is not head)
    return Shape(policy=policy, value=trunk + h + 1, value_head=h + 1, linears=linears,
                 source="meta-device build")


def bytes_per_param(record: Path = MEMORY_RECORD) -> tuple[dict, str]:
    """The record's measured bytes per parameter per strategy (`ddp`, `fsdp`, `lora`; per model), and where the
    numbers come from. Without the record: 16 B per trained parameter (fp32 AdamW), 4 B per frozen one."""
    try:
        bpp = json.loads(record.read_text(encoding="utf-8"))["bytes_per_param"]
        if all(s in bpp for s in ("ddp", "fsdp", "lora")):
            return bpp, f"measured ({record.name})"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    full = {"per_rank": FALLBACK_BPP, "all_ranks": FALLBACK_BPP, "frozen_per_frozen_param": None,
            "state_per_trained_param": FALLBACK_BPP}
    lora = {**full, "frozen_per_frozen_param": 4.0}
    return ({"ddp": {"policy": full, "value": full}, "fsdp": {"policy": full, "value": full},
             "lora": {"policy": lora, "value": lora}}, "fp32 AdamW arithmetic (no memory record)")


@dataclass(frozen=True)
class Need:
    """Bytes per rank of weights, gradients and optimizer states, and how they were computed."""

    per_rank: int
    strategy: str
    bytes_per_param: float
    """Effective bytes per parameter of policy + value on one rank."""


def memory_need(cfg, shape: Shape, bpp: dict) -> Need:
    """Per-rank bytes of the models that a run of `cfg` holds (policy, value, KL reference): ddp replicates
    (measured per-rank B/param), fsdp divides the measured all-rank total by the world size, lora keeps the
    frozen weights on every rank plus the adapters' states. Activations come on top."""
    world = cfg.distributed.world_size
    critic = cfg.decisions.uses_critic
    value = shape.value if critic else 0
    ref = cfg.training.kl_coef > 0 and not cfg.lora.enabled
    if cfg.lora.enabled:
        b = bpp["lora"]["policy"]
        adapters = shape.adapters(cfg.lora.r, cfg.lora.target_modules)
        total = b["frozen_per_frozen_param"] * shape.policy + b["state_per_trained_param"] * adapters
        if critic and cfg.lora.value_lora:
            total += b["frozen_per_frozen_param"] * value + b["state_per_trained_param"] * (adapters
                                                                                            + shape.value_head)
        elif critic:
            total += bpp["ddp"]["value"]["per_rank"] * value
        strategy = "lora"
    elif cfg.distributed.strategy == "fsdp" and world > 1:
        total = (bpp["fsdp"]["policy"]["all_ranks"] * shape.policy + bpp["fsdp"]["value"]["all_ranks"] * value
                 + 4 * ref * shape.policy) / world
        strategy = "fsdp"
    else:
        total = bpp["ddp"]["policy"]["per_rank"] * shape.policy + bpp["ddp"]["value"]["per_rank"] * value \
            + 4 * ref * shape.policy
        strategy = "ddp" if world > 1 else "single"
    n = shape.policy + value
    return Need(per_rank=math.ceil(total), strategy=strategy, bytes_per_param=round(total / max(n, 1), 2))


def checkpoint_bytes(cfg, shape: Shape) -> int:
    """One checkpoint on disk: fp32 policy (merged under LoRA), the value model (or its adapters and head), the
    AdamW states (8 B per trained parameter) and, under LoRA, the adapters."""
    critic = cfg.decisions.uses_critic
    if cfg.lora.enabled:
        adapters = shape.adapters(cfg.lora.r, cfg.lora.target_modules)
        value_trained = adapters + shape.value_head if cfg.lora.value_lora else shape.value
        trained = adapters + (value_trained if critic else 0)
        return 4 * (shape.policy + adapters + (value_trained if critic else 0)) + 8 * trained
    trained = shape.policy + (shape.value if critic else 0)
    return 4 * trained + 8 * trained
