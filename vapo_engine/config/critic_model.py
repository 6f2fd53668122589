"""config.toml [critic]: a value model smaller than the policy, to trade critic capacity for speed (docs/design.md §3.8).

By default the critic is the policy's architecture at full size with a scalar head (or `model.value_path`'s
model). `[critic]` makes it smaller in one of two ways, sharing the policy's tokenizer either way (the critic
reads the policy's token ids):
- its own model folder (`model_path`): any Hugging Face model directory whose vocabulary covers the policy's
  tokenizer, e.g. a small model of the same family; loaded like `model.value_path` (set one of the two);
- a fraction of the policy (`width_ratio`, `depth_ratio`): the policy's config with fewer layers
  (round(layers × depth_ratio), at least 1) and/or fewer attention heads of the same head size and a
  proportionally narrower MLP (width_ratio). A depth-only reduction starts from the policy's embeddings, its
  first layers and its final norm; any width reduction starts fresh (the architecture's own initialisation,
  seeded by the run seed). The scalar head starts at zero either way.
The smaller critic is saved in checkpoints as it is (resume and `pretrain-value` keep its shape). Torch-free.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import PathText, Section
from .errors import FieldProblem


class CriticConfig(Section):
    """[critic] the value model's size. Unset = the policy's architecture at full size."""

    model_path: PathText | None = None
    """A Hugging Face model directory to build the critic from (a smaller model with the policy's tokenizer, or
    a value model saved by `vapo-mcp pretrain-value`); unset = the policy's own architecture (see the ratios).
    The same as model.value_path: set one of the two."""
    width_ratio: float = Field(1.0, gt=0, le=1)
    """Fraction of the policy's width for the critic: attention heads (same head size) and MLP width scaled by
    it (at least one head). Below 1 the critic starts from fresh weights (seeded by the run seed)."""
    depth_ratio: float = Field(1.0, gt=0, le=1)
    """Fraction of the policy's layers for the critic (rounded, at least 1). With width_ratio = 1 the critic
    starts from the policy's embeddings and first layers."""

    head: Literal["linear", "surprise"] = "linear"
    """The value head (vapo_engine/rollout/value_head.py). `linear`: a scalar on the last hidden state (the VAPO
    paper's critic, verl's and OpenRLHF's). `surprise`: that plus a small MLP that also reads the policy's
    log-probs of the response tokens written so far (the last one, the lowest, their mean, how many were below
    1/2), so the critic sees a mistake the moment the policy samples an unlikely token. On builtin:chain the
    hidden-state critic cannot see the policy's wrong signs at all (linear probes at chance, held-out AUC ≈ 0.5;
    the policy's own log-prob of the sign: AUC 1.0): bench/results/critic_fit.json. Costs one policy forward
    per value-pretraining rollout (the log-probs), nothing in policy steps (their old log-probs are reused)."""

    ceiling_within_prompt: float | None = Field(None, gt=0, le=1)
    """The highest within-prompt explained variance any critic can reach on this run's task from its starting
    policy, when measured (`python -m bench.experiments.critic` estimates it from Monte-Carlo continuations); the
    progress lines then show the critic's within-prompt EV next to it. Unset = not known, not shown."""

    @model_validator(mode="after")
    def _one_way(self) -> CriticConfig:
        if self.model_path and self.scaled:
            raise FieldProblem("critic.model_path", "the critic is given both its own folder and a width/depth "
                               "ratio of the policy", "set critic.model_path, or critic.width_ratio / "
                               "critic.depth_ratio, not both")
        return self

    @property
    def scaled(self) -> bool:
        """Whether the critic is a fraction of the policy."""
        return self.width_ratio != 1.0 or self.depth_ratio != 1.0
