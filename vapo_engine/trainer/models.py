"""Load the models of a run: policy, value model (scalar head on the same architecture), frozen reference.

Any local Hugging Face causal LM directory works; `model.local_path` unset means the built-in tiny model
(shipped with the package; built into the cache only for a changed recipe). The value model is
`AutoModelForTokenClassification(num_labels=1)` initialised from the policy weights (or `model.value_path`),
so it saves and loads as a plain HF directory; [critic] may make it a fraction of the policy (small_critic.py). The rollout backend that `[rollout] backend` names
(`vapo_engine.rollout.backends`) comes with them (`Models.backend`). This file does not train anything.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PreTrainedModel,
)
from transformers.utils import logging as hf_logging

from vapo_engine.config.train_model import RolloutConfig
from vapo_engine.errors import UserError
from vapo_engine.rollout.backends import RolloutBackend, make_backend
from vapo_engine.rollout.tokenizer import NO_REMOTE_CODE, load_tokenizer, refuse_remote_code
from vapo_engine.rollout.value_head import attach_head, head_kind

from .small_critic import CriticShapeError, build_small_value


class ModelLoadError(UserError):
    """A model directory that cannot be used, with the fix."""


@dataclass
class Models:
    policy: PreTrainedModel
    value: PreTrainedModel | None
    reference: object | None
    """A frozen model called like the policy (a loaded copy, or `lora.FrozenBase`: the policy, adapters off)."""
    tokenizer: object
    device: torch.device
    autocast_dtype: torch.dtype | None
    source: str
    backend: RolloutBackend = field(default_factory=lambda: make_backend(RolloutConfig()))
    """Where rollouts and evaluations are sampled (`[rollout] backend`; default: in process, from `policy`)."""

    def autocast(self):
        """bf16/fp16 autocast context where configured, else a no-op."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("training.device = \"cuda\" but CUDA is not available; set training.device = "
                             "\"auto\" or \"cpu\"")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(f"cuda:{local_rank}") if name == "cuda" else torch.device(name)


def pick_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    """`auto` = bf16 autocast on CUDA devices that support it, none on CPU (fp32 keeps the tiny model exact)."""
    if dtype == "float32":
        return None
    if dtype == "auto":
        ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if ok else None
    return torch.bfloat16 if dtype == "bfloat16" else torch.float16


def resolve_model_path(local_path: str | None, log=print, task: str = "builtin:addition") -> Path:
    """The directory to load: `local_path` (a folder, or a .gguf file converted into the cache), or the built-in
    model named `task` (a training task, or a `model.builtin` name: a tiny model shipped with the package, tasks
    without a model of their own use builtin:addition's; or a packaged pretrained model, converted)."""
    from vapo_engine.realmodels.convert import model_folder
    from vapo_engine.realmodels.source import is_gguf_spec
    if local_path and is_gguf_spec(local_path) or not local_path and is_gguf_spec(task):
        return model_folder(local_path or task, log=log)  # a GGUF input, dequantized once into the cache
    if local_path:
        p = Path(local_path).expanduser()
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"model.local_path {str(p)!r} is not a Hugging Face model directory (no "
                                 "config.json); point it at a folder made by save_pretrained, or unset it to "
                                 "use the built-in tiny model")
        return p
    from vapo_engine.builtin_model import RECIPES, builtin_model_dir
    return Path(builtin_model_dir(task=task if task in RECIPES else "builtin:addition", log=log))


def load_models(path: Path, *, value_path: str | Path | None, need_value: bool,
                reference_path: str | Path | None, device: torch.device,
                autocast_dtype: torch.dtype | None, rollout: RolloutConfig | None = None,
                value_shape: tuple[float, float] | None = None, seed: int = 0, value_head: str = "linear") -> Models:
    """Load tokenizer + policy from `path`, the value model from `value_path` (default `path`) when needed,
    scaled to `value_shape` = (width_ratio, depth_ratio) of it when given (fresh weights seeded by `seed`), and
    a frozen reference from `reference_path` when given, all onto `device`; the rollout backend that `rollout`
    names (default: the in-process "hf"). `value_head` (critic.head) is the head of a fresh value model; one
    loaded from a saved value model must be the head it was saved with."""
    backend = make_backend(rollout or RolloutConfig())  # an unknown name fails before any weights load
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tok = load_tokenizer(path)
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **NO_REMOTE_CODE)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load model from {str(path)!r}: {e}") from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    value = _load_value(Path(value_path) if value_path else path, value_shape, seed, value_head) \
        if need_value else None
    if value is not None and value.config.vocab_size < len(tok):
        raise ModelLoadError(f"the value model from {str(value_path or path)!r} knows {value.config.vocab_size} "
                             f"token ids, the policy's tokenizer has {len(tok)}: the critic reads the policy's "
                             "token ids, so build it with the policy's tokenizer (critic.model_path)")
    ref = _load_reference(reference_path) if reference_path else None
    for m in (policy, value, ref):
        if m is not None:  # eval mode throughout: no dropout, so old and new log-probs agree exactly
            m.to(device).eval()
    if ref is not None:
        ref.requires_grad_(False)
    return Models(policy, value, ref, tok, device, autocast_dtype, str(path), backend)


def _load_reference(path: str | Path) -> PreTrainedModel:
    try:
        refuse_remote_code(path)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **NO_REMOTE_CODE)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load the reference model from {str(path)!r}: {e}") from None


def _load_value(path: Path, shape: tuple[float, float] | None = None, seed: int = 0, head: str = "linear"
                ) -> PreTrainedModel:
    """The value model from `path` (scaled to `shape`: small_critic.py) with the value head `head`
    (rollout/value_head.py). A head that the directory does not hold (a policy or base model) starts at zero,
    so the fresh critic predicts 0 everywhere (explained variance 0, not the −0.2…−0.4 of a random head) and its
    first gradients come from the targets alone; a saved value model keeps its own head, which must be `head`."""
    try:
        refuse_remote_code(path)
        if shape is not None and shape != (1.0, 1.0):
            model, info = build_small_value(path, *shape, seed)
        else:
            cfg = AutoConfig.from_pretrained(path, num_labels=1, **NO_REMOTE_CODE)
            cfg.classifier_dropout = 0.0
            model, info = AutoModelForTokenClassification.from_pretrained(
                path, config=cfg, dtype=torch.float32, output_loading_info=True, **NO_REMOTE_CODE)
    except CriticShapeError as e:
        raise ModelLoadError(str(e)) from None
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot build a value model from {str(path)!r} ({e}); set model.value_path to "
                             "a model whose architecture has a token-classification head, or use "
                             "training.algorithm = \"grpo\" (no value model)") from None
    fresh = {k.rsplit(".", 1)[0] for k in info.get("missing_keys", [])}
    with torch.no_grad():
        for name, module in model.named_modules():
            if name in fresh and name.split(".")[-1] in ("score", "classifier"):  # the new scalar head
                for p in module.parameters():
                    p.zero_()
    saved = head_kind(model)
    if saved != "linear" and saved != head:
        raise ModelLoadError(f"the value model in {str(path)!r} was saved with critic.head = {saved!r}, this run "
                             f"asks for {head!r}: set critic.head = {saved!r}, or start the critic from a model "
                             "without a value head of its own")
    attach_head(model, saved if saved != "linear" else head, path if saved != "linear" else None)
    return model
