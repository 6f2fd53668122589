"""config.toml [lora]: low-rank adapters (LoRA, Hu et al. 2021, arXiv 2106.09685) instead of full fine-tuning.

With `enabled`, the policy gets LoRA adapters on `target_modules` and only those train; its frozen base
doubles as the KL reference model (no second copy is loaded). The value model gets adapters on its trunk plus
a fully trained scalar head (`value_lora`), or trains in full. Checkpoints keep `policy/` a plain, merged
Hugging Face directory (what `serve-model` and `vapo-mcp eval` load) and the adapters beside it for resume
(`vapo_engine.trainer.lora`). Needs the `peft` package: `pip install 'vapo-mcp[lora]'`.

Torch-free and peft-free: `peft_missing()` asks the import system whether peft is installed (no import).
"""
from __future__ import annotations

import importlib.util
import re

from pydantic import Field, field_validator, model_validator

from .base import Section
from .errors import FieldProblem

ALL_LINEAR = "all-linear"
"""`target_modules` shorthand: every linear layer of the transformer trunk (not the LM or value head)."""
INSTALL_HINT = "pip install 'vapo-mcp[lora]'  (or: pip install 'peft>=0.13,<1')"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


class LoraConfig(Section):
    """[lora] low-rank adapters for the policy (and the value trunk). Off by default: full fine-tuning."""

    enabled: bool = False
    """Train LoRA adapters instead of all weights. Memory: the optimizer holds only the adapters, and the
    frozen base serves as the KL reference (training.kl_coef > 0) without loading a second model. LoRA usually
    wants a learning rate ~10× the full fine-tuning one (e.g. 1e-5 … 1e-4 for 7B models)."""
    r: int = Field(16, ge=1, le=4096)
    """The rank of each adapter (ΔW = B·A, A: r × in, B: out × r). 8–64 is usual; keep it well below the
    hidden size (the built-in tiny model has hidden 128: r ≤ 16)."""
    alpha: float = Field(32.0, gt=0, le=1_000_000)
    """LoRA α: the update is scaled by α / r (α / √r with use_rslora). 2·r is a common choice."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input, active in the update passes only (rollouts, old/reference log-probs
    and evaluation run without it). Keep 0 for RL: dropout makes the PPO ratio noisy before any update."""
    target_modules: list[str] = Field(default_factory=lambda: [ALL_LINEAR])
    """Which layers get adapters: ["all-linear"] = every linear layer of the trunk (attention q/k/v/o and MLP
    gate/up/down projections on Qwen2/Llama/Mistral; c_attn/c_proj/c_fc on GPT-2), never the LM head or the
    value head; or layer names such as ["q_proj", "v_proj"] (a module matches when its path ends with one).
    From the command line: --set 'lora.target_modules=["q_proj","v_proj"]' (or =q_proj,v_proj)."""
    value_lora: bool = True
    """The value model trains LoRA adapters on its trunk (same r, α, targets) plus its full scalar head;
    false = the whole value model trains (weights, gradients and AdamW state of a full model). Default true:
    a fully trained critic would cost as much memory as training without LoRA at all."""
    use_rslora: bool = False
    """Rank-stabilised LoRA (Kalajdzievski 2023): scale by α / √r, not α / r (high ranks still learn)."""

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split_names(cls, v):
        """A single string (from --set or TOML) is a comma-separated list of names."""
        if isinstance(v, str):
            return [s.strip() for s in v.split(",") if s.strip()]
        return v

    @model_validator(mode="after")
    def _check_targets(self) -> LoraConfig:
        names = self.target_modules
        if not names:
            raise FieldProblem("lora.target_modules", "no layer is named", f'use ["{ALL_LINEAR}"] or layer '
                               'names such as ["q_proj", "k_proj", "v_proj", "o_proj"]')
        if ALL_LINEAR in names and len(names) > 1:
            raise FieldProblem("lora.target_modules", f'"{ALL_LINEAR}" already means every linear layer',
                               f'use ["{ALL_LINEAR}"] alone, or list layer names without it')
        bad = [n for n in names if n != ALL_LINEAR and not _MODULE_NAME.match(n)]
        if bad:
            raise FieldProblem("lora.target_modules", f"{bad[0]!r} is not a module name",
                               'use names of the model\'s layers, e.g. "q_proj" or "mlp.down_proj"')
        return self

    @property
    def scaling(self) -> float:
        """The factor applied to B·A: α / r, or α / √r with use_rslora."""
        return self.alpha / (self.r ** 0.5 if self.use_rslora else self.r)


def peft_missing(lora: LoraConfig) -> str | None:
    """Why a run with this [lora] section cannot start here (peft is not installed), or None."""
    if lora.enabled and importlib.util.find_spec("peft") is None:
        return f"lora.enabled = true needs the peft package, which is not installed: {INSTALL_HINT}"
    return None
