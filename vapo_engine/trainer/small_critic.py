"""A value model that is a fraction of the policy ([critic] width_ratio / depth_ratio; config/critic_model.py).

`smaller_config` keeps the policy's architecture and vocabulary and scales the number of layers (depth) and the
number of attention heads of the same head size and the MLP width (width). `build_small_value` makes the value
model from it: depth only → loaded from the policy's directory (its embeddings, its first layers, its final
norm; the later layers are not loaded), any width change → fresh weights from the architecture's own
initialisation under a generator seeded by `seed` (the same on every rank). The scalar head starts at zero
(models._zero_new_head). This file loads weights only; it does not train.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForTokenClassification

from vapo_engine.errors import UserError
from vapo_engine.rollout.tokenizer import NO_REMOTE_CODE

SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


class CriticShapeError(UserError):
    """A [critic] ratio that cannot be applied to the policy's config, with the fix."""


def smaller_config(cfg, width: float, depth: float):
    """A copy of the HF config `cfg` with round(layers × depth) layers (≥ 1) and, for width < 1, round(heads ×
    width) attention heads (≥ 1) of the same head size, key/value heads scaled alike (dividing the heads), and
    the MLP width scaled by `width`."""
    missing = [n for n in SHAPE_FIELDS if not isinstance(getattr(cfg, n, None), int)]
    if missing:
        raise CriticShapeError(f"critic.width_ratio / critic.depth_ratio need a model config with "
                               f"{', '.join(SHAPE_FIELDS)}; this {getattr(cfg, 'model_type', '?')} config has no "
                               f"{', '.join(missing)}: give the critic its own folder with critic.model_path")
    out = copy.deepcopy(cfg)
    layers = max(1, round(cfg.num_hidden_layers * depth))
    out.num_hidden_layers = layers
    if isinstance(getattr(out, "layer_types", None), list):
        out.layer_types = out.layer_types[:layers]
    if width < 1:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        heads = max(1, round(cfg.num_attention_heads * width))
        kv = max(1, round((getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * width))
        while heads % kv:
            kv -= 1
        out.num_attention_heads, out.num_key_value_heads = heads, kv
        out.hidden_size = heads * head_dim
        if getattr(cfg, "head_dim", None):
            out.head_dim = head_dim
        out.intermediate_size = max(1, round(cfg.intermediate_size * width))
    return out


def build_small_value(path: Path, width: float, depth: float, seed: int):
    """(value model, loading info) of the policy in `path` scaled by `width` / `depth` (module docstring)."""
    cfg = AutoConfig.from_pretrained(path, num_labels=1, **NO_REMOTE_CODE)
    cfg.classifier_dropout = 0.0
    small = smaller_config(cfg, width, depth)
    if width == 1:
        return AutoModelForTokenClassification.from_pretrained(path, config=small, dtype=torch.float32,
                                                               output_loading_info=True, **NO_REMOTE_CODE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForTokenClassification.from_config(small, dtype=torch.float32)
    return model, {"missing_keys": [f"{n}.weight" for n, m in model.named_modules()
                                    if n.split(".")[-1] in ("score", "classifier")]}
