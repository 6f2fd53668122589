"""Old outputs of a rollout, with the first update's forward pass taken at the same time (docs/design.md §3.7).

Before the first optimizer step of a rollout the models still have the weights that sampled it, so the forward
pass of the first micro-batch of the first mini-batch IS the old-output pass of those rows: `old_outputs` runs it
once, with gradients, on exactly the rows (and, with a token budget, the trimmed width) that `update_step` will
see first, keeps its graph (`FirstForward`), and takes the old log-probs / values of those rows from it (detached).
`update_step` then uses the kept outputs instead of a second forward (`FirstForward.serves`). Nothing changes in
the algorithm: the kept log-probs equal the old ones bit for bit (ratio exactly 1), and the gradients are those
of a fresh forward of the same rows with the same weights. Old log-probs read off the sampler
(rollout.old_log_probs = "sampler") stay the old ones for every row, these too (ratio 1 up to the rounding of
the sampler's KV-cached forward). The other rows' old outputs come by micro-batches
without gradients as before (`attach_old_outputs`).

Cost: the kept graphs (one micro-batch of the policy and of the value model) live from the old-output pass to
the first update, next to each other, instead of one after the other. So the reuse is off where memory is
being saved on purpose (`gradient_checkpointing`) and where the update's forward would not be the old one
(LoRA dropout, which is on in update passes only), and under fsdp (`reuse_possible`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vapo_engine.config import TrainConfig
from vapo_engine.rollout.experience import (
    Rollout,
    attach_old_outputs,
    response_log_probs,
    response_values,
    value_log_probs,
)

from .update import UpdateSpec, micro_batch_rows


@dataclass
class FirstForward:
    """The first micro-batch's forward outputs, with their graphs."""

    input_ids: torch.Tensor
    """The micro-batch's token ids (N, P + r), to recognise it in `update_step`."""
    log_probs: torch.Tensor | None
    """Policy log-probs (N, r) with their graph; None when the actor does not train (value pretraining)."""
    values: torch.Tensor | None
    """Values (N, r) with their graph; None without a value model."""

    def serves(self, mb: Rollout) -> bool:
        """Whether `mb` is the micro-batch these outputs were computed on."""
        return self.input_ids.shape == mb.input_ids.shape and bool(torch.equal(self.input_ids, mb.input_ids))


def reuse_possible(cfg: TrainConfig, sharded: bool) -> bool:
    """Whether the first update's forward can be the old-output pass (see the module docstring)."""
    lora_dropout = cfg.lora.enabled and cfg.lora.dropout > 0
    return not (cfg.training.gradient_checkpointing or lora_dropout or sharded)


def old_outputs(models, ro: Rollout, micro_batch: int, first_mini: torch.Tensor | None, spec: UpdateSpec,
                max_count, *, policy: bool = True) -> tuple[Rollout, FirstForward | None]:
    """`attach_old_outputs(models, ro, micro_batch, policy=policy)`, except that when `first_mini` (the row
    indices of the first mini-batch) is given, the rows of its first micro-batch (`micro_batch_rows` with
    `max_count`, as `update_step` splits it) are scored once with gradients, kept, and their detached outputs
    become their old outputs."""
    if first_mini is None:
        return attach_old_outputs(models, ro, micro_batch, policy=policy), None
    mini = ro.rows(first_mini)
    rows = first_mini[micro_batch_rows(mini, spec, max_count)[0]]
    mb = ro.rows(rows)
    mb = mb.trimmed() if spec.micro_batch_tokens is not None else mb
    keep = torch.ones(ro.size, dtype=torch.bool, device=rows.device)
    keep[rows] = False
    rest = attach_old_outputs(models, ro.rows(torch.nonzero(keep).squeeze(-1)), micro_batch, policy=policy) \
        if bool(keep.any()) else None
    lp = ent = ref = v = value_lp = None
    with torch.enable_grad(), models.autocast():
        if policy:
            lp, ent = response_log_probs(models.policy, mb, with_entropy=True)
            if models.reference is not None:
                with torch.no_grad():
                    ref = response_log_probs(models.reference, mb)[0]
        if models.value is not None:
            value_lp = value_log_probs(models, mb) if lp is None else None  # a surprise head's inputs
            v = response_values(models.value, mb, lp if lp is not None else value_lp)
    firsts = {"old_log_probs": lp if lp is not None else value_lp, "entropy": ent, "ref_log_probs": ref, "values": v}
    merged = {name: _merge(None if rest is None else getattr(rest, name), keep, rows, first,
                           ro.response_mask.shape[1]) for name, first in firsts.items()
              if first is not None and getattr(ro, name) is None}  # the sampler's old log-probs are kept whole
    return replace(ro, **merged), FirstForward(mb.input_ids, lp, v)


def _merge(rest: torch.Tensor | None, keep: torch.Tensor, rows: torch.Tensor, first: torch.Tensor, width: int
           ) -> torch.Tensor:
    """(N, width) in the rollout's row order: the other rows' outputs where `keep`, the first micro-batch's
    (`rows`, detached; zero past their trimmed width: padding) elsewhere."""
    out = first.new_zeros((keep.shape[0], width), dtype=first.dtype)
    if rest is not None:
        out[keep] = rest.to(out.dtype)
    out[rows, :first.shape[1]] = first.detach()
    return out
