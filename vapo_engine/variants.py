"""Ablation variants: full VAPO, each "w/o X" of docs/design.md §3, and the baselines, as config overrides. Torch-free.

Every variant is the base config plus `--set` style overrides, so a variant run is an ordinary run with the
same seeds and number of policy steps (not the same compute: value pretraining or a critic adds work to
some). The paper's AIME 2024 avg@32 (Qwen2.5-32B) is kept for reference only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import TrainConfig


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    overrides: tuple[str, ...]
    paper_aime: float | None = None

    def apply(self, config: TrainConfig) -> list[str]:
        """The overrides for this variant on `config` ({clip_range} is filled from the config)."""
        return [o.format(clip_range=config.training.clip_range) for o in self.overrides]


_OFF_ALL = ("vapo.value_pretrain_steps=0", "vapo.decoupled_gae=false", "vapo.use_length_adaptive=false",
            "vapo.token_level_loss=false", "vapo.positive_lm_coef=0", "vapo.positive_replay=false")

VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("vapo", "full VAPO", (), 60.4),
    Variant("no_value_pretrain", "w/o Value-Pretraining", ("vapo.value_pretrain_steps=0",), 11),
    Variant("no_decoupled_gae", "w/o Decoupled-GAE (critic trained on λ_policy targets)",
            ("vapo.decoupled_gae=false",), 33),
    Variant("no_length_adaptive", "w/o Length-adaptive GAE (λ_policy = lambda_base)",
            ("vapo.use_length_adaptive=false",), 45),
    Variant("no_clip_higher", "w/o Clip-Higher (ε_high = ε_low)", ("vapo.clip_higher=false",), 46),
    Variant("no_token_level_loss", "w/o Token-level Loss (sample-level mean)", ("vapo.token_level_loss=false",), 53),
    Variant("no_positive_lm", "w/o Positive Example LM Loss", ("vapo.positive_lm_coef=0",), 54),
    Variant("no_group_sampling", "w/o Group-Sampling (1 sample per prompt, same sample budget)",
            ("vapo.group_size=1",), 55),
    Variant("no_positive_replay", "w/o positive replay buffer", ("vapo.positive_replay=false",), None),
    Variant("ppo", "baseline: vanilla PPO (one λ, no VAPO components)",
            ("training.algorithm=ppo", *_OFF_ALL, "vapo.clip_higher=false"), 5),
    Variant("grpo", "baseline: GRPO (critic-free, group-normalised advantage)",
            ("training.algorithm=grpo", "vapo.value_pretrain_steps=0", "vapo.token_level_loss=false",
             "vapo.positive_lm_coef=0", "vapo.positive_replay=false", "vapo.clip_higher=false"), None),
    Variant("rft", "baseline: rejection-sampling fine-tuning (NLL on the policy's own correct samples)",
            ("training.algorithm=rft", "vapo.value_pretrain_steps=0", "vapo.positive_lm_coef=1",
             "vapo.positive_replay=false"), None),
    Variant("dapo", "baseline: DAPO-style (GRPO + Clip-Higher + token-level loss)",
            ("training.algorithm=grpo", "vapo.value_pretrain_steps=0", "vapo.positive_lm_coef=0",
             "vapo.positive_replay=false"), 50),
]}

DEFAULT_ABLATION = ("vapo", "no_value_pretrain", "no_decoupled_gae", "no_length_adaptive", "no_clip_higher",
                    "no_token_level_loss", "no_positive_lm", "no_group_sampling", "ppo", "grpo")


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise KeyError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    return VARIANTS[name]
