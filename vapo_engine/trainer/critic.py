"""The critic's own recipe: value pretraining with real mini-batch updates and a stopping rule, and explained
variance that means the same thing in every run.

Value pretraining (docs/design.md §3.5): each round samples a fresh rollout from the frozen initial policy, measures the
critic's explained variance on it *before* training on it (so the number is held-out), then fits the critic to
Monte-Carlo returns (λ = 1) with `mini_batch_size` updates over `value_pretrain_epochs` passes. It stops at
`value_pretrain_steps` rounds, or earlier when the held-out EV has not improved by `value_pretrain_min_delta`
for `value_pretrain_patience` rounds. EV is also logged by position inside the response (quarters) and by
response length, so a critic that only learns the end of answers, or only short ones, shows.

`critic/explained_var` is always measured against Monte-Carlo returns, whatever targets the critic trains on
(λ_critic, or λ_policy without Decoupled-GAE), so the column compares across ablation rows; EV against the
training targets is `critic/explained_var_targets`. Undefined EV (constant returns) is omitted, never logged.
"""
from __future__ import annotations

import math
import statistics

from vapo_engine.algo import ev_from_stats, ev_stats

from . import streams
from .advantages import monte_carlo_returns
from .fsdp import export_hf, is_sharded
from .lora import save_plain
from .update import update_step

VALUE_ONLY = "value_pretrain"
"""run.json `mode` of a `vapo-mcp pretrain-value` run: value pretraining only, then the value model is saved."""
LENGTH_BUCKETS = (("short", 0, 48), ("mid", 49, 120), ("long", 121, 10**9))
"""Response length (tokens) buckets of the EV breakdown."""


def explained_var(name: str, values, targets, mask, world) -> dict[str, float]:
    """{name: EV} from global statistics over the valid tokens of `mask`; {} when undefined."""
    ev = float(ev_from_stats(world.sum(ev_stats(values, targets, mask))))
    return {name: ev} if math.isfinite(ev) else {}


def mc_explained_var(ro, world, name: str = "critic/explained_var") -> dict[str, float]:
    """EV of the rollout's old values against Monte-Carlo returns (λ = 1: the sequence reward everywhere), and
    the returns' variance over the valid tokens (`critic/return_var`): with both, EV pools over steps as
    1 − Σ (1 − EV)·var / Σ var instead of averaging ratios."""
    if ro.values is None:
        return {}
    mc = monte_carlo_returns(ro).returns
    st = world.sum(ev_stats(ro.values, mc, ro.response_mask))
    ev, n = float(ev_from_stats(st)), float(st[0].clamp(min=1))
    var = float(st[2] / n - (st[1] / n) ** 2)
    return ({name: ev} if math.isfinite(ev) else {}) | {"critic/return_var": max(var, 0.0)}


def ev_breakdown(ro, world, prefix: str) -> dict[str, float]:
    """EV against the rollout's returns by position quarter of the response and by response length."""
    mask = ro.response_mask
    lengths = mask.sum(1, keepdim=True).clamp(min=1)
    pos = (mask.cumsum(1) - 1).clamp(min=0) / lengths  # 0 … <1 over each response
    out = {}
    for q in range(4):
        sel = mask * ((pos >= q / 4) & (pos < (q + 1) / 4)).to(mask.dtype)
        out |= explained_var(f"{prefix}ev_pos_q{q + 1}", ro.values, ro.returns, sel, world)
    for name, lo, hi in LENGTH_BUCKETS:
        sel = mask * ((lengths >= lo) & (lengths <= hi)).to(mask.dtype)
        out |= explained_var(f"{prefix}ev_len_{name}", ro.values, ro.returns, sel, world)
    return out


def value_pretrain_round(tr, collect, minibatches) -> dict[str, float]:
    """One value-pretraining round (see the module docstring); returns its metrics."""
    ro, prompts_digest = collect(tr, "pretrain")
    ro = monte_carlo_returns(ro)
    metrics = explained_var("critic/pretrain_explained_var", ro.values, ro.returns, ro.response_mask, tr.world)
    metrics |= ev_breakdown(ro, tr.world, "critic/pretrain_")
    mini_size = tr.cfg.mini_batch_size // tr.world.world_size
    losses = []
    shuffle = streams.generator(tr.info.seed, "shuffle", "pretrain", tr.pretrain_step, tr.world.rank)
    for _ in range(tr.cfg.vapo.value_pretrain_epochs):
        for idx in minibatches(ro.size, mini_size, shuffle):
            m = update_step(tr.models, tr.opt_actor, tr.opt_critic, ro.rows(idx), None, tr.spec,
                            train_actor=False, reduce_sum=tr.world.sum, sync_grads=tr.world.sync_gradients,
                            reduce_max=tr.world.max_int)
            tr.sched_critic.step()
            losses.append(m["critic/value_loss"])
    tr.pretrain_step += 1
    _track_plateau(tr, metrics.get("critic/pretrain_explained_var"))
    metrics |= tr.world.reduce_metrics({"critic/pretrain_value_loss": sum(losses) / len(losses)}, "sum")
    metrics |= tr.world.reduce_metrics({"rollout/accuracy": float(ro.correct.float().mean()),
                                        "critic/pretrain_updates": float(len(losses)),
                                        "rollout/prompts_digest": prompts_digest})
    return metrics


def _track_plateau(tr, ev: float | None) -> None:
    """Record the held-out EV; mark pretraining done once the median EV of the last `patience` rounds is not
    `min_delta` above the best median of any earlier window of as many rounds (patience 0 = only the step cap).
    Windows and medians, not single rounds: one round's EV comes from one small fresh rollout and is noisy (on
    builtin:chain with 64 samples it jumped from 0.35 to -0.47 between rounds of a rising critic), and a
    zero-init head sits at EV 0 for its first rounds — comparing single rounds stopped pretraining on noise."""
    v = tr.cfg.vapo
    hist = tr.history.setdefault("pretrain_ev", [])
    hist.append(ev if ev is not None else float("nan"))
    k = v.value_pretrain_patience
    if k and plateaued(hist, k, v.value_pretrain_min_delta):
        tr.history["pretrain_stopped_at"] = tr.pretrain_step


def plateaued(hist: list[float], k: int, min_delta: float) -> bool:
    """Whether the last k values (their median; undefined values skipped) fail to beat every earlier k-window's
    median by min_delta. Needs 2k values."""
    def median(xs: list[float]) -> float:
        ok = [x for x in xs if not math.isnan(x)]
        return statistics.median(ok) if ok else float("-inf")
    if len(hist) < 2 * k:
        return False
    best_before = max(median(hist[i:i + k]) for i in range(len(hist) - 2 * k + 1))
    return median(hist[-k:]) < best_before + min_delta


def pretraining_done(tr) -> bool:
    return (not tr.uses_critic or tr.pretrain_step >= tr.cfg.decisions.value_pretrain_steps
            or "pretrain_stopped_at" in tr.history)


def save_value_model(tr, out) -> None:
    """The trained value model as a plain HF directory (usable as `model.value_path`; LoRA adapters merged),
    written by rank 0; under fsdp every rank must call it (the shards are gathered)."""
    if is_sharded(tr.models.value):
        export_hf(tr.models.value, out, tr.world.is_main)
    elif tr.world.is_main:
        save_plain(tr.models.value, out)
    if tr.world.is_main:
        tr.models.tokenizer.save_pretrained(out)

