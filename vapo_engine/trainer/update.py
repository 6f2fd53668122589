"""One optimizer step of the actor and/or the critic on a mini-batch, with gradient accumulation.

Every loss is divided by the mini-batch's *global* counts (tokens, sequences, positive tokens), so
accumulating micro-batches gives exactly the full-batch gradient (docs/design.md §3.7, token-level loss), however the
rows are split: by count (`micro_batch`), or by a token budget (`micro_batch_tokens`: rows of similar length
together, each micro-batch cut to its own longest response; every rank runs as many micro-batches as the
busiest one, `reduce_max`). Under data parallel the counts are all-reduced by `reduce_sum` before use. The
positive-example NLL covers this batch's correct responses plus replayed ones, over one joint denominator.
With `gradient_checkpointing` the passes run under `memory.checkpointing` (activations recomputed in the
backward pass). Does not sample or compute advantages.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from vapo_engine.algo import aggregate_loss, get_policy_loss, kl_penalty, positive_nll_loss, value_loss
from vapo_engine.rollout.experience import Rollout, response_log_probs, response_values

from .fsdp import is_sharded, local_norm
from .lora import adapter_dropout
from .memory import checkpointing, split_to_count, token_budget_split


@dataclass(frozen=True)
class UpdateSpec:
    """The scalars of one update, taken from the config by the caller (no config object in here)."""

    policy_loss: str = "clip_higher"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    reduction: str = "token_mean"
    positive_lm_coef: float = 0.0
    kl_coef: float = 0.0
    value_clip: float | None = None
    max_grad_norm: float = 1.0
    micro_batch: int = 8
    micro_batch_tokens: int | None = None
    """Token budget per micro-batch (rows × padded length); None = `micro_batch` rows each."""
    gradient_checkpointing: bool = False
    """Run the passes under `memory.checkpointing` (the models must have been prepared by
    `memory.apply_memory_options`)."""


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def update_step(models, opt_actor, opt_critic, mini: Rollout, replay: Rollout | None, spec: UpdateSpec, *,
                train_actor: bool = True, train_critic: bool = True,
                reduce_sum: Callable[[torch.Tensor], torch.Tensor] = _identity,
                sync_grads: Callable[[torch.nn.Module], None] = lambda m: None,
                reduce_max: Callable[[int], int] = lambda n: n) -> dict[str, float]:
    """Accumulate over micro-batches, sync gradients across ranks, clip, step. Returns the step's metrics
    (actor/…, critic/…). `reduce_sum` all-reduces the counts; `sync_grads` SUMs a model's gradients;
    `reduce_max` gives the largest micro-batch count over ranks (token-budget splits only)."""
    mask = mini.response_mask
    counts = reduce_sum(torch.stack([mask.sum(), torch.tensor(float(mini.size), device=mask.device),
                                     (mask * mini.correct[:, None]).sum()
                                     + (replay.response_mask.sum() if replay is not None else 0.0)]))
    n_tok, n_seq, n_pos = counts.clamp(min=1.0)
    sums: dict[str, float] = {}
    if train_actor:
        opt_actor.zero_grad(set_to_none=True)
    if train_critic:
        opt_critic.zero_grad(set_to_none=True)
    trained = (models.policy if train_actor else None, models.value if train_critic else None)
    with adapter_dropout(*trained), checkpointing(*trained) if spec.gradient_checkpointing else nullcontext():
        for mb in micro_batches(mini, spec, reduce_max):
            weight = float(mb.response_mask.sum() / n_tok)
            if train_actor:
                _add(sums, _actor_micro(models, mb, spec, n_tok, n_seq, n_pos), weight)
            if train_critic:
                _add(sums, _critic_micro(models, mb, spec, n_tok), weight)
        if train_actor and spec.positive_lm_coef > 0:
            _replay_nll(models, mini, replay, spec, n_pos, sums, reduce_max)
    out = dict(sums)
    if train_actor:
        sync_grads(models.policy)
        out["actor/grad_norm"] = _clip_and_step(models.policy, opt_actor, spec.max_grad_norm)
    if train_critic:
        sync_grads(models.value)
        out["critic/grad_norm"] = _clip_and_step(models.value, opt_critic, spec.max_grad_norm)
    return out


def _replay_nll(models, mini: Rollout, replay: Rollout | None, spec: UpdateSpec, n_pos, sums: dict,
                reduce_max: Callable[[int], int]) -> None:
    """The positive-example NLL of the replayed responses. Sharded models (fsdp) run every forward as a
    collective, so when any rank has replay every rank makes the pass; one without runs its first row with
    weight 0 (no gradient, no metric)."""
    if is_sharded(models.policy):
        if reduce_max(int(replay is not None)) == 0:
            return
    elif replay is None:
        return
    rows, weight = (replay, 1.0) if replay is not None else (mini.rows(slice(0, 1)), 0.0)
    with models.autocast():
        lp, _ = response_log_probs(models.policy, rows)
        nll = positive_nll_loss(lp, rows.response_mask, rows.correct, global_token_count=n_pos)
    (weight * spec.positive_lm_coef * nll).backward()
    if replay is not None:
        sums["actor/positive_nll"] = sums.get("actor/positive_nll", 0.0) + float(nll.detach())


def micro_batches(mini: Rollout, spec: UpdateSpec, reduce_max: Callable[[int], int] = lambda n: n
                  ) -> Iterator[Rollout]:
    """The micro-batches of `mini`, made one at a time: `spec.micro_batch` rows each in order, or with
    `spec.micro_batch_tokens` the token-budget split (padded to `reduce_max(count)` micro-batches), each
    trimmed to its own longest response."""
    if spec.micro_batch_tokens is None:
        for s in range(0, mini.size, spec.micro_batch):
            yield mini.rows(slice(s, s + spec.micro_batch))
        return
    lengths = mini.lengths
    parts = token_budget_split(lengths, mini.prompt_len, spec.micro_batch_tokens, spec.micro_batch)
    for idx in split_to_count(parts, reduce_max(len(parts)), lengths, mini.prompt_len):
        yield mini.rows(idx).trimmed()


def _actor_micro(models, mb: Rollout, spec: UpdateSpec, n_tok, n_seq, n_pos) -> dict[str, float]:
    loss_fn = get_policy_loss(spec.policy_loss)
    with models.autocast():
        lp, _ = response_log_probs(models.policy, mb)
        pg, m = loss_fn(lp, mb.old_log_probs, mb.advantages, mb.response_mask, clip_low=spec.clip_low,
                        clip_high=spec.clip_high, dual_clip=spec.dual_clip, reduction=spec.reduction,
                        global_token_count=n_tok, global_seq_count=n_seq)
        loss = pg
        out = {"actor/pg_loss_sum": float(pg.detach())}
        if spec.positive_lm_coef > 0:
            nll = positive_nll_loss(lp, mb.response_mask, mb.correct, global_token_count=n_pos)
            loss = loss + spec.positive_lm_coef * nll
            out["actor/positive_nll_sum"] = float(nll.detach())
        if spec.kl_coef > 0 and mb.ref_log_probs is not None:
            kl = aggregate_loss(kl_penalty(lp, mb.ref_log_probs, "k3", mask=mb.response_mask), mb.response_mask, "token_mean",
                                global_token_count=n_tok)
            loss = loss + spec.kl_coef * kl
            out["actor/kl_ref_sum"] = float(kl.detach())
    loss.backward()
    for k in ("pg_clipfrac", "pg_clipfrac_high", "pg_clipfrac_low", "approx_kl", "ratio_max"):
        out[f"actor/{k}"] = float(m[k])
    return out


def _critic_micro(models, mb: Rollout, spec: UpdateSpec, n_tok) -> dict[str, float]:
    with models.autocast():
        v = response_values(models.value, mb)
        vl, m = value_loss(v, mb.values, mb.returns, mb.response_mask, clip_range=spec.value_clip,
                           reduction="token_mean", global_token_count=n_tok)
    vl.backward()
    return {"critic/value_loss_sum": float(vl.detach()), "critic/vf_clipfrac": float(m["vf_clipfrac"])}


def _add(sums: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """`*_sum` entries are already globally normalised (add them); the rest are token-weighted means."""
    for k, v in metrics.items():
        if k.endswith("_sum"):
            k, w = k[:-4], 1.0
        else:
            w = weight
        if k == "actor/ratio_max":
            sums[k] = max(sums.get(k, v), v)
        else:
            sums[k] = sums.get(k, 0.0) + w * v


def _clip_and_step(model, opt, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return local_norm(norm)  # a DTensor when the gradients are sharded (fsdp)
