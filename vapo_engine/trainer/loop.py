"""The VAPO training recipe, top to bottom (docs/design.md §3, §5):

  0. evaluate the starting policy on the held-out set
  1. value pretraining: rollouts of the frozen initial policy, critic fitted to Monte-Carlo returns (λ = 1)
  2. per rollout step: sample prompts × group_size → reward → old log-probs / values → decoupled,
     length-adaptive GAE → mini-batch updates (Clip-Higher token-level PG + positive NLL with replay + value
     loss) → log → evaluate / checkpoint on their intervals
  3. final evaluation, checkpoint and summary.json

`stop_after` (tests) ends the loop after that many policy steps as if the worker were killed (no extra
checkpoint). `should_stop()` is polled between rollout steps for a graceful stop (checkpoint, then exit).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vapo_engine.rollout.evaluate import Split, evaluate
from vapo_engine.rollout.experience import Rollout, attach_old_outputs, from_token_ids, sample_rollout
from vapo_engine.rundir import SUMMARY_JSON, RunDir

from . import streams
from .advantages import add_advantages
from .checkpoint import save_checkpoint
from .critic import (
    VALUE_ONLY,
    explained_var,
    mc_explained_var,
    pretraining_done,
    save_value_model,
    value_pretrain_round,
)
from .distributed import shutdown
from .fsdp import is_sharded
from .replay import replay_count
from .setup import Trainer, build_trainer
from .sharded_checkpoint import save_sharded
from .update import update_step


def train(run_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
          should_stop: Callable[[], bool] = lambda: False, on_record: Callable[[dict], None] = lambda r: None,
          log=print) -> dict:
    """Run (or resume) the training of `run_dir` to completion; returns the summary written to summary.json."""
    run_dir = Path(run_dir)
    tr = build_trainer(run_dir, resume=resume, log=log)
    t0, status = time.time(), "succeeded"
    try:
        if RunDir(run_dir).meta().get("mode") == VALUE_ONLY:
            return _value_only(tr, run_dir, on_record, should_stop, t0, log)
        if tr.step == 0 and "start_eval" not in tr.history:
            tr.history["start_eval"] = _evaluate(tr, on_record)
        while not pretraining_done(tr):
            metrics = value_pretrain_round(tr, _collect, _minibatches)
            on_record(tr.logger.log(tr.pretrain_step, "pretrain", metrics))
        while tr.step < tr.cfg.training.total_steps:
            before = tr.step
            metrics = rollout_step(tr)
            on_record(tr.logger.log(tr.step, "train", metrics))
            _on_intervals(tr, before, on_record)
            if stop_after is not None and tr.step >= stop_after:
                return {"status": "interrupted", "step": tr.step}
            if float(tr.world.sum(torch.tensor([float(should_stop())]))) > 0:  # every rank stops together
                status = "stopped"
                break
        final = _evaluate(tr, on_record) if status == "succeeded" else tr.history.get("last_eval", {})
        _save(tr)
        summary = _summary(tr, status, final, time.time() - t0)
        if tr.world.is_main:
            RunDir(run_dir).write_json(SUMMARY_JSON, summary)
        return summary
    finally:
        tr.provider.close()
        tr.logger.close()
        shutdown(tr.world)


def rollout_step(tr: Trainer) -> dict[str, float]:
    """sample → reward → values → advantages → updates; returns the step's metrics."""
    t0 = time.perf_counter()
    ro, prompts_digest = _collect(tr, "policy", ask_provider=True)
    ro, metrics = add_advantages(ro, tr.cfg, reduce_sum=tr.world.sum)
    metrics["rollout/prompts_digest"] = prompts_digest
    metrics.update(_rollout_metrics(ro, tr.cfg.vapo.group_size, tr.world))
    if ro.values is not None:
        metrics |= mc_explained_var(ro, tr.world)
        metrics |= explained_var("critic/explained_var_targets", ro.values, ro.returns, ro.response_mask, tr.world)
    t1 = time.perf_counter()
    updates, mini_size = [], tr.cfg.mini_batch_size // tr.world.world_size
    shuffle = streams.generator(tr.info.seed, "shuffle", "policy", tr.rollout_step, tr.world.rank)
    for _ in range(tr.cfg.training.ppo_epochs):
        for idx in _minibatches(ro.size, mini_size, shuffle):
            if tr.step >= tr.cfg.training.total_steps:
                break
            updates.append(_one_update(tr, ro.rows(idx)))
    tr.replay.add_correct(ro)
    tr.replay.add_pairs(tr.provider.collect(), source="provider")
    tr.rollout_step += 1
    t2 = time.perf_counter()
    upd = {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]} if updates else {}
    shares = {k: v for k, v in upd.items() if k in SUMMED_ACROSS_RANKS}
    metrics.update({k: v for k, v in upd.items() if k not in shares})
    metrics.update({"vapo/replay_size": len(tr.replay), "vapo/replay_provider": tr.replay.count("provider"),
                    "actor/lr": tr.sched_actor.get_last_lr()[0],
                    "perf/step_time_s": t2 - t0, "perf/rollout_time_s": t1 - t0, "perf/update_time_s": t2 - t1,
                    "perf/update_samples_per_s": len(updates) * mini_size / max(t2 - t1, 1e-9)})
    if tr.sched_critic is not None:
        metrics["critic/lr"] = tr.sched_critic.get_last_lr()[0]
    # provider numbers exist on rank 0 only: added after the cross-rank reduction (which needs equal names)
    return tr.world.reduce_metrics(metrics) | tr.world.reduce_metrics(shares, "sum") | tr.provider.metrics()


# update metrics that are this rank's share of a globally normalised quantity (see update.py): sum them
SUMMED_ACROSS_RANKS = frozenset({"actor/pg_loss", "actor/positive_nll", "actor/kl_ref", "critic/value_loss",
                                 "actor/pg_clipfrac", "actor/pg_clipfrac_high", "actor/pg_clipfrac_low",
                                 "actor/approx_kl", "critic/vf_clipfrac", "vapo/positive_samples",
                                 "vapo/replay_samples"})


def _collect(tr: Trainer, phase: str, ask_provider: bool = False) -> tuple[Rollout, float]:
    """A rollout of `phase` ("policy" step or value-"pretrain" round) and the digest of its prompt list. Every
    rank draws the same global prompt list (the phase's prompt stream at this step, trainer/streams.py) and
    samples its own slice of groups, so the global batch does not depend on the world size and a group never
    spans ranks."""
    cfg, w, seed = tr.cfg, tr.world, tr.info.seed
    index = tr.rollout_step if phase == "policy" else tr.pretrain_step
    prompts = tr.task.train_batch(cfg.prompts_per_step, streams.rng(seed, f"{phase}_prompts", index))
    if ask_provider:  # policy steps only (not value pretraining); rank 0: answers arrive in the background
        tr.provider.submit(prompts)
    share = cfg.prompts_per_step // w.world_size
    mine = prompts[w.rank * share:(w.rank + 1) * share]
    problems = [p for p in mine for _ in range(cfg.vapo.group_size)]
    with streams.seeded(seed, "sampling", phase, index, w.rank, device=tr.models.device):
        ro = sample_rollout(tr.models, tr.task, problems, max_new_tokens=cfg.model.max_tokens,
                            temperature=cfg.model.temperature, top_p=cfg.model.top_p, prompt_format=tr.prompts)
    return attach_old_outputs(tr.models, ro, cfg.micro_batch_size), streams.digest([p.prompt for p in prompts])


def _one_update(tr: Trainer, mini) -> dict[str, float]:
    replay = None
    v = tr.cfg.vapo
    if tr.cfg.decisions.positive_replay:
        n = replay_count(int(mini.correct.sum()), v.replay_ratio, len(tr.replay))
        pairs = tr.replay.sample(n, streams.rng(tr.info.seed, "replay", tr.step, tr.world.rank))
        replay = from_token_ids(pairs, tr.models.tokenizer.pad_token_id, tr.models.device,
                                temperature=tr.cfg.model.temperature) if pairs else None
    m = update_step(tr.models, tr.opt_actor, tr.opt_critic, mini, replay, tr.spec, train_critic=tr.uses_critic,
                    reduce_sum=tr.world.sum, sync_grads=tr.world.sync_gradients,
                    reduce_max=tr.world.max_int)
    tr.sched_actor.step()
    if tr.sched_critic is not None:
        tr.sched_critic.step()
    tr.step += 1
    m["vapo/positive_samples"] = float(mini.correct.sum())
    m["vapo/replay_samples"] = float(replay.size if replay is not None else 0)
    return m


def _minibatches(n: int, size: int, gen: torch.Generator) -> list[torch.Tensor]:
    perm = torch.randperm(n, generator=gen) if size < n else torch.arange(n)
    return [perm[s:s + size] for s in range(0, n, size)]


def _rollout_metrics(ro, group_size: int, world) -> dict[str, float]:
    """Per-sample numbers are means of equal-sized rank shares (averaged over ranks later); the token means
    (entropy, value and return means) are global here, because ranks hold different numbers of tokens."""
    lengths = ro.lengths.float()
    groups = ro.scores.view(-1, group_size)
    out = {"rollout/reward_mean": float(ro.scores.mean()), "rollout/accuracy": float(ro.correct.float().mean()),
           "rollout/response_length": float(lengths.mean()), "rollout/response_length_max": float(lengths.max()),
           "rollout/truncated_frac": float((ro.response_mask[:, -1] > 0).float().mean()),
           "rollout/no_signal_groups": float((groups.max(1).values == groups.min(1).values).float().mean()),
           "rollout/tokens_per_s": float(lengths.sum()) / max(ro.gen_seconds, 1e-9),
           "actor/entropy": _token_mean(ro.entropy, ro.response_mask, world)}
    if ro.values is not None and ro.returns is not None:
        out["critic/value_mean"] = _token_mean(ro.values, ro.response_mask, world)
        out["critic/return_mean"] = _token_mean(ro.returns, ro.response_mask, world)
    return out


def _token_mean(x: torch.Tensor, mask: torch.Tensor, world) -> float:
    """Mean of `x` over the valid tokens of every rank."""
    s = world.sum(torch.stack([(x * mask).sum(), mask.sum()]).double())
    return float(s[0] / s[1].clamp(min=1))


def _evaluate(tr: Trainer, on_record) -> dict[str, float]:
    """Rank 0 evaluates (the others wait; under fsdp every rank takes a slice); every rank keeps the result."""
    c = tr.cfg
    m, w = {}, tr.world
    sharded = is_sharded(tr.models.policy)  # every forward is a collective: all ranks evaluate, a slice each
    if w.is_main or sharded:
        m = evaluate(tr.models, tr.eval_task, num_problems=c.eval.num_problems,
                     samples_per_problem=c.eval.samples_per_problem, max_new_tokens=c.model.max_tokens,
                     temperature=c.model.temperature, top_p=c.model.top_p,
                     seed=streams.seed_of(tr.info.seed, "eval", tr.step), prompt_format=tr.eval_prompts,
                     split=Split(w.rank, w.world_size, w.sum) if sharded else None)
    if w.is_main:
        on_record(tr.logger.log(tr.step, "eval", m))
    m = tr.world.broadcast_json(m)
    tr.history["last_eval"] = m
    return m


def _on_intervals(tr: Trainer, before: int, on_record) -> None:
    crossed = (lambda every: tr.step // every > before // every)
    if crossed(tr.cfg.eval.eval_interval) and tr.step < tr.cfg.training.total_steps:  # the end has its own
        _evaluate(tr, on_record)
    if crossed(tr.cfg.eval.save_interval):
        _save(tr)


def _save(tr: Trainer) -> None:
    """ddp / one process: rank 0 writes the checkpoint (every rank holds the full weights), the others wait.
    fsdp: every rank writes its shards (sharded_checkpoint)."""
    if is_sharded(tr.models.policy):
        save_sharded(tr.info.run_dir, tr.step, tr.models, tr.opt_actor, tr.opt_critic, tr.state_dict(), tr.world)
        return
    if tr.world.is_main:
        save_checkpoint(tr.info.run_dir, tr.step, tr.models, tr.state_dict())
    tr.world.barrier()


def _value_only(tr: Trainer, run_dir: Path, on_record, should_stop, t0: float, log) -> dict:
    """`vapo-mcp pretrain-value`: value pretraining alone, then the value model as a reusable HF directory
    (`<run dir>/value_model`, or run.json's `value_out`) that runs start from with model.value_path."""
    status = "succeeded"
    while not pretraining_done(tr):
        metrics = value_pretrain_round(tr, _collect, _minibatches)
        on_record(tr.logger.log(tr.pretrain_step, "pretrain", metrics))
        if float(tr.world.sum(torch.tensor([float(should_stop())]))) > 0:
            status = "stopped"
            break
    out = Path(RunDir(run_dir).meta().get("value_out") or run_dir / "value_model")
    evs = [e for e in tr.history.get("pretrain_ev", []) if math.isfinite(e)]
    summary = {"status": status, "mode": VALUE_ONLY, "run_id": tr.info.run_id, "steps": tr.pretrain_step,
               "value_path": str(out), "best_heldout_explained_var": max(evs) if evs else None,
               "last_heldout_explained_var": evs[-1] if evs else None,
               "stopped_early_at": tr.history.get("pretrain_stopped_at"), "seconds": round(time.time() - t0, 1)}
    save_value_model(tr, out)  # collective under fsdp (gathers the shards); rank 0 writes
    if tr.world.is_main:
        RunDir(run_dir).write_json(SUMMARY_JSON, summary)
        log(f"value model saved to {out}; start runs from it with --set model.value_path=\"{out}\"")
    return summary


def _summary(tr: Trainer, status: str, final: dict, seconds: float) -> dict:
    start = tr.history.get("start_eval", {})
    g0, g1 = start.get("eval/greedy_accuracy"), final.get("eval/greedy_accuracy")
    return {"status": status, "run_id": tr.info.run_id, "steps": tr.step, "rollout_steps": tr.rollout_step,
            "start_eval": start, "final_eval": final,
            "greedy_accuracy_gain": None if g0 is None or g1 is None or math.isnan(g1 - g0) else g1 - g0,
            "seconds": round(seconds, 1), "model": tr.models.source}
