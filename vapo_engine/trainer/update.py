"""One optimizer step of the actor and/or the critic on a mini-batch, with gradient accumulation.

Every loss is divided by the mini-batch's *global* counts (tokens, sequences, positive tokens), so
accumulating micro-batches gives exactly the full-batch gradient (docs/design.md §3.7, token-level loss), however the
rows are split: by count (`micro_batch`), or by a token budget (`micro_batch_tokens`: rows of similar length
together, each micro-batch cut to its own longest response; every rank runs as many micro-batches as the
busiest one). Under data parallel the counts are all-reduced before use (`parallel.Parallel`). The
positive-example NLL covers this batch's correct responses plus replayed ones, over one joint denominator:
the replayed rows ride along in the actor's micro-batches (spread evenly, one forward pass with the rows they
join: `joined_log_probs`), and the policy loss and the NLL are summed before one backward pass. A `FirstForward`
(trainer/first_forward.py) stands in for the forward pass of the first micro-batch when it was kept from the
old-output pass. With `gradient_checkpointing` the passes run under `memory.checkpointing` (activations recomputed in the
backward pass). Tokens sampled by another copy of the policy carry importance weights
(`Rollout.is_weights`, trainer/offpolicy.py), which scale each token's policy-gradient term; without them the loss
is untouched. Does not sample or compute advantages.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from vapo_engine.algo import aggregate_loss, get_policy_loss, kl_penalty, positive_nll_loss, value_loss
from vapo_engine.algo.mismatch import weighted_advantages
from vapo_engine.config import TrainConfig
from vapo_engine.metrics import MAX, combine_rule
from vapo_engine.rollout.experience import Rollout, joined_log_probs, response_log_probs, response_values

from .fsdp import local_norm
from .lora import adapter_dropout
from .memory import checkpointing, split_to_count, token_budget_split
from .parallel import ONE_PROCESS, Parallel


@dataclass(frozen=True)
class UpdateSpec:
    """The scalars of one update (no config object in here), made from a run's config by `UpdateSpec.of`."""

    policy_loss: str
    clip_low: float
    clip_high: float
    dual_clip: float | None
    reduction: str
    positive_lm_coef: float
    kl_coef: float
    value_clip: float | None
    max_grad_norm: float
    micro_batch: int
    micro_batch_tokens: int | None
    """Token budget per micro-batch (rows × padded length); None = `micro_batch` rows each."""
    gradient_checkpointing: bool
    """Run the passes under `memory.checkpointing` (the models must have been prepared by
    `memory.apply_memory_options`)."""

    @classmethod
    def of(cls, cfg: TrainConfig, world_size: int = 1) -> UpdateSpec:
        """The loss choices from the config's derived `Decisions`, the optimisation scalars from its sections;
        micro-batches never larger than a rank's share of the mini-batch."""
        d, v, t = cfg.decisions, cfg.vapo, cfg.training
        return cls(policy_loss=d.policy_loss, clip_low=d.clip_low, clip_high=d.clip_high, reduction=d.loss_reduction,
                   positive_lm_coef=d.positive_lm_coef, dual_clip=v.dual_clip or None, kl_coef=t.kl_coef,
                   value_clip=v.value_clip_range or None, max_grad_norm=t.max_grad_norm,
                   micro_batch=min(cfg.micro_batch_size, cfg.mini_batch_size // world_size),
                   micro_batch_tokens=t.micro_batch_tokens, gradient_checkpointing=t.gradient_checkpointing)


def update_step(models, opt_actor, opt_critic, mini: Rollout, replay: Rollout | None, spec: UpdateSpec, *,
                parallel: Parallel = ONE_PROCESS, train_actor: bool = True, train_critic: bool = True,
                first=None) -> dict[str, float]:
    """Accumulate over micro-batches, sync gradients across ranks, clip, step. Returns the step's metrics
    (actor/…, critic/…), each this rank's share or mean as its catalogue rule says (combined over ranks later).
    `parallel` all-reduces the counts, syncs the gradients and keeps the ranks' forward passes in lock-step.
    `first` (a `first_forward.FirstForward`): the kept outputs of the first micro-batch, used when they are of
    exactly its rows. The step's seconds in the actor's and the critic's micro-batches (forward + backward) and in
    the optimizer steps (gradient sync, clipping, step) come back as perf/actor_time_s, perf/critic_time_s and
    perf/optimizer_time_s."""
    mask = mini.loss_mask
    counts = parallel.sum(torch.stack([mask.sum(), torch.tensor(float(mini.size), device=mask.device),
                                       (mask * mini.correct[:, None]).sum()
                                       + (replay.loss_mask.sum() if replay is not None else 0.0)]))
    n_tok, n_seq, n_pos = counts.clamp(min=1.0)
    sums: dict[str, float] = {}
    clock = {"perf/actor_time_s": 0.0} if train_actor else {}
    clock |= {"perf/critic_time_s": 0.0} if train_critic else {}
    if train_actor:
        opt_actor.zero_grad(set_to_none=True)
    if train_critic:
        opt_critic.zero_grad(set_to_none=True)
    trained = (models.policy if train_actor else None, models.value if train_critic else None)
    with adapter_dropout(*trained), checkpointing(*trained) if spec.gradient_checkpointing else nullcontext():
        mbs = list(micro_batches(mini, spec, parallel.max_int))
        riders = _riders(replay if train_actor and spec.positive_lm_coef > 0 else None, len(mbs))
        for i, mb in enumerate(mbs):
            weight = float(mb.loss_mask.sum() / n_tok)
            kept = first if i == 0 and first is not None and first.serves(mb) else None
            if train_actor:
                t = time.perf_counter()
                _add(sums, *_actor_micro(models, mb, spec, n_tok, n_seq, n_pos, riders[i],
                                         kept.log_probs if kept else None), weight)
                clock["perf/actor_time_s"] += time.perf_counter() - t
            if train_critic:
                t = time.perf_counter()
                _add(sums, *_critic_micro(models, mb, spec, n_tok, kept.values if kept else None), weight)
                clock["perf/critic_time_s"] += time.perf_counter() - t
    out = dict(sums)
    t = time.perf_counter()
    if train_actor:
        parallel.sync_gradients(models.policy)
        out["actor/grad_norm"] = _clip_and_step(models.policy, opt_actor, spec.max_grad_norm)
    if train_critic:
        parallel.sync_gradients(models.value)
        out["critic/grad_norm"] = _clip_and_step(models.value, opt_critic, spec.max_grad_norm)
    return out | clock | {"perf/optimizer_time_s": time.perf_counter() - t}


def _riders(replay: Rollout | None, k: int) -> list[Rollout | None]:
    """The replayed rows spread over `k` micro-batches in order (⌈n / k⌉ each, None where none are left), so
    no micro-batch grows by more than that. Every rank runs one forward per micro-batch with or without
    riders, which keeps the ranks in lock-step."""
    if replay is None:
        return [None] * k
    per = -(-replay.size // k)
    return [replay.rows(slice(i * per, (i + 1) * per)).trimmed() if i * per < replay.size else None
            for i in range(k)]


def _policy_log_probs(models, mb: Rollout, rider: Rollout | None, kept: torch.Tensor | None):
    """Log-probs of the micro-batch's rows and of its riders: from one joined forward pass, or the kept ones
    (`first_forward`) and a pass of the riders alone."""
    if kept is not None:
        return kept, response_log_probs(models.policy, rider)[0] if rider is not None else None
    if rider is None:
        return response_log_probs(models.policy, mb)[0], None
    return joined_log_probs(models.policy, mb, rider)


def micro_batches(mini: Rollout, spec: UpdateSpec, max_count: Callable[[int], int] = lambda n: n
                  ) -> Iterator[Rollout]:
    """The micro-batches of `mini`, made one at a time: `spec.micro_batch` rows each in order, or with
    `spec.micro_batch_tokens` the token-budget split (padded to `max_count(count)` micro-batches: the busiest
    rank's), each trimmed to its own longest response."""
    for idx in micro_batch_rows(mini, spec, max_count):
        yield mini.rows(idx) if spec.micro_batch_tokens is None else mini.rows(idx).trimmed()


def micro_batch_rows(mini: Rollout, spec: UpdateSpec, max_count: Callable[[int], int] = lambda n: n
                     ) -> list[slice | torch.Tensor]:
    """The rows of each of `micro_batches(mini, spec, max_count)` (before any trimming)."""
    if spec.micro_batch_tokens is None:
        return [slice(s, s + spec.micro_batch) for s in range(0, mini.size, spec.micro_batch)]
    lengths = mini.lengths
    parts = token_budget_split(lengths, mini.prompt_len, spec.micro_batch_tokens, spec.micro_batch)
    return split_to_count(parts, max_count(len(parts)), lengths, mini.prompt_len)


def _actor_micro(models, mb: Rollout, spec: UpdateSpec, n_tok, n_seq, n_pos, rider: Rollout | None = None,
                 kept: torch.Tensor | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Backward of the actor's losses on one micro-batch, with the positive NLL of its replayed `rider` rows
    in the same backward pass; (loss shares, token means of the micro-batch)."""
    loss_fn = get_policy_loss(spec.policy_loss)
    with models.autocast():
        lp, rider_lp = _policy_log_probs(models, mb, rider, kept)
        adv = weighted_advantages(mb.advantages, mb.is_weights)  # w·L(A) = L(w·A): the IS-weighted PG loss
        pg, m = loss_fn(lp, mb.old_log_probs, adv, mb.loss_mask, clip_low=spec.clip_low,
                        clip_high=spec.clip_high, dual_clip=spec.dual_clip, reduction=spec.reduction,
                        global_token_count=n_tok, global_seq_count=n_seq)
        loss = pg
        shares = {"actor/pg_loss": float(pg.detach())}
        if spec.positive_lm_coef > 0:
            nll = positive_nll_loss(lp, mb.loss_mask, mb.correct, global_token_count=n_pos)
            if rider_lp is not None:
                nll = nll + positive_nll_loss(rider_lp, rider.loss_mask, rider.correct, global_token_count=n_pos)
            loss = loss + spec.positive_lm_coef * nll
            shares["actor/positive_nll"] = float(nll.detach())
        if spec.kl_coef > 0 and mb.ref_log_probs is not None:
            kl = aggregate_loss(kl_penalty(lp, mb.ref_log_probs, "k3", mask=mb.loss_mask), mb.loss_mask,
                                "token_mean", global_token_count=n_tok)
            loss = loss + spec.kl_coef * kl
            shares["actor/kl_ref"] = float(kl.detach())
    loss.backward()
    return shares, {f"actor/{k}": float(m[k]) for k in ("pg_clipfrac", "pg_clipfrac_high", "pg_clipfrac_low",
                                                         "approx_kl", "ratio_max")}


def _critic_micro(models, mb: Rollout, spec: UpdateSpec, n_tok, kept: torch.Tensor | None = None
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Backward of the value loss on one micro-batch (its values `kept` from the old-output pass, or a forward
    now); (loss share, token means of the micro-batch)."""
    with models.autocast():
        v = kept if kept is not None else response_values(models.value, mb)
        vl, m = value_loss(v, mb.values, mb.returns, mb.loss_mask, clip_range=spec.value_clip,
                           reduction="token_mean", global_token_count=n_tok)
    vl.backward()
    return {"critic/value_loss": float(vl.detach())}, {"critic/vf_clipfrac": float(m["vf_clipfrac"])}


def _add(sums: dict[str, float], shares: dict[str, float], means: dict[str, float], weight: float) -> None:
    """Loss shares are already divided by the global counts: add them. A micro-batch's token means add with
    `weight` (its share of the global tokens), except `max` metrics, which keep the largest."""
    for k, v in shares.items():
        sums[k] = sums.get(k, 0.0) + v
    for k, v in means.items():
        sums[k] = max(sums.get(k, v), v) if combine_rule(k) == MAX else sums.get(k, 0.0) + weight * v


def _clip_and_step(model, opt, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return local_norm(norm)  # a DTensor when the gradients are sharded (fsdp)
