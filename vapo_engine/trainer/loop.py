"""The VAPO training recipe, top to bottom (docs/design.md §3, §5):

  0. evaluate the starting policy on the held-out set
  1. value pretraining: rollouts of the frozen initial policy, critic fitted to Monte-Carlo returns (λ = 1)
  2. per rollout step: sample prompts × group_size → reward → old log-probs / values → decoupled, length-adaptive
     GAE → mini-batch updates (Clip-Higher token-level PG + positive NLL with replay + value loss) → log →
     evaluate / checkpoint on their intervals. Samples of another copy of the policy carry importance weights;
     with rollout.max_off_policy_steps > 0 the next rollout is sampled during the updates (offpolicy.py)
  3. final evaluation, checkpoint and summary.json

How the processes work together (saving, evaluation, stop vote, lock-step, combining metrics over ranks) is
`tr.parallel`'s (parallel.py): this file reads the same for one process, ddp and fsdp. `stop_after` (tests)
ends the loop after that many policy steps as if the worker were killed (no extra checkpoint); `should_stop()`
is polled between rollout steps for a graceful stop (checkpoint, then exit).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vapo_engine.rollout.episodes import episode_metrics
from vapo_engine.rollout.evaluate import evaluate
from vapo_engine.rollout.experience import Rollout, from_token_ids
from vapo_engine.rundir import SUMMARY_JSON, VALUE_MODEL, RunDir

from . import streams, weight_sync
from .advantages import add_advantages, monte_carlo_returns
from .batches import collect, minibatches
from .critic import (
    VALUE_ONLY,
    ev_breakdown,
    explained_var,
    heldout_ev,
    mc_explained_var,
    plateaued,
    within_explained_var,
)
from .first_forward import FirstForward
from .offpolicy import (
    correct_mismatch,
    more_rollouts,
    policy_version,
)
from .replay import replay_count
from .setup import Trainer, build_trainer
from .update import update_step


def train(run_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
          should_stop: Callable[[], bool] = lambda: False, on_record: Callable[[dict], None] = lambda r: None,
          log=print) -> dict:
    """Run (or resume) the training of `run_dir` to completion; returns the summary written to summary.json.
    A `vapo-mcp pretrain-value` run (run.json mode VALUE_ONLY) stops after value pretraining (`value_only`)."""
    run_dir = Path(run_dir)
    tr = build_trainer(run_dir, resume=resume, log=log)
    t0, status = time.time(), "succeeded"
    try:
        sync = weight_sync.attach(tr, log)  # a remote rollout backend gets the policy's weights now and per step
        if RunDir(run_dir).meta().get("mode") == VALUE_ONLY:
            return value_only(tr, run_dir, on_record, should_stop, t0, log)
        if tr.step == 0 and tr.history.start_eval is None:
            tr.history.start_eval = evaluate_policy(tr, on_record)
        pretrain_value(tr, on_record)
        total = tr.cfg.training.total_steps
        while tr.step < total:
            before = tr.step
            metrics = rollout_step(tr)  # advances tr.step: the record carries the step after the updates
            sync.after_step(tr)
            on_record(tr.logger.log(tr.step, "train", metrics))
            if tr.step // tr.cfg.eval.eval_interval > before // tr.cfg.eval.eval_interval and tr.step < total:
                evaluate_policy(tr, on_record)  # (the end has its own evaluation)
            if tr.step // tr.cfg.eval.save_interval > before // tr.cfg.eval.save_interval:
                save(tr)
            if stop_after is not None and tr.step >= stop_after:
                return {"status": "interrupted", "step": tr.step}
            if tr.parallel.stop_vote(should_stop()):
                status = "stopped"
                break
        final = evaluate_policy(tr, on_record) if status == "succeeded" else tr.history.last_eval
        save(tr)
        summary = _summary(tr, status, final, time.time() - t0)
        if tr.parallel.is_main:
            RunDir(run_dir).write_json(SUMMARY_JSON, summary)
        return summary
    finally:
        tr.prefetch.close()
        tr.episode.close()
        tr.provider.close()
        tr.models.backend.close()
        tr.logger.close()
        tr.parallel.shutdown()


def pretrain_value(tr: Trainer, on_record, should_stop: Callable[[], bool] | None = None) -> bool:
    """Value-pretraining rounds (with a critic) until `value_pretrain_steps` or a plateau; with `should_stop`,
    every rank votes after each round and all stop together. Returns whether they stopped."""
    rounds = tr.cfg.decisions.value_pretrain_steps
    while tr.uses_critic and tr.pretrain_step < rounds and tr.history.pretrain_stopped_at is None:
        metrics = value_pretrain_round(tr)
        on_record(tr.logger.log(tr.pretrain_step, "pretrain", metrics))
        if should_stop is not None and tr.parallel.stop_vote(should_stop()):
            return True
    return False


def value_pretrain_round(tr: Trainer) -> dict[str, float]:
    """A fresh rollout of the frozen initial policy; the critic's explained variance on it *before* training on
    it (held-out), then `value_pretrain_epochs` passes of mini-batch updates towards Monte-Carlo returns."""
    ro, prompts_digest, first = collect(tr, "pretrain", tr.pretrain_step)
    ro = monte_carlo_returns(ro)
    metrics = explained_var("critic/pretrain_explained_var", ro.values, ro.returns, ro.loss_mask,
                            tr.parallel.sum)
    metrics |= within_explained_var("critic/pretrain_explained_var_within_prompt", ro.values, ro.returns,
                                    ro.loss_mask, tr.cfg.vapo.group_size, tr.parallel.sum)
    metrics |= ev_breakdown(ro, tr.parallel.sum, "critic/pretrain_")
    losses = []
    for idx in minibatches(tr, ro.size, "pretrain", tr.pretrain_step, tr.cfg.vapo.value_pretrain_epochs):
        m = update_step(tr.models, tr.opt_actor, tr.opt_critic, ro.rows(idx), None, tr.spec, parallel=tr.parallel,
                        train_actor=False, first=first)
        first = None
        tr.sched_critic.step()
        losses.append(m["critic/value_loss"])
    tr.pretrain_step += 1
    v, ev = tr.cfg.vapo, metrics.get("critic/pretrain_explained_var")
    tr.history.pretrain_ev.append(ev if ev is not None else float("nan"))
    if v.value_pretrain_patience and plateaued(tr.history.pretrain_ev, v.value_pretrain_patience,
                                               v.value_pretrain_min_delta):
        tr.history.pretrain_stopped_at = tr.pretrain_step
    metrics |= {"critic/pretrain_value_loss": sum(losses) / len(losses),
                "rollout/accuracy": float(ro.correct.float().mean()), "critic/pretrain_updates": float(len(losses)),
                "rollout/prompts_digest": prompts_digest}
    return tr.parallel.combine(metrics)


def rollout_step(tr: Trainer) -> dict[str, float]:
    """sample → reward → values → advantages → updates; returns the step's metrics."""
    t0 = time.perf_counter()
    ro, prompts_digest, first = collect(tr, "policy", tr.rollout_step, ask_provider=True)
    ro, mismatch = correct_mismatch(tr, ro)  # importance weights where another copy of the policy sampled
    ro, metrics = add_advantages(ro, tr.cfg, reduce_sum=tr.parallel.sum)
    metrics |= mismatch | {"rollout/prompts_digest": prompts_digest,
                           "rollout/weight_version_lag": float(policy_version(tr) - ro.weight_version),
                           "rollout/dropped_stale": float(tr.prefetch.dropped)}
    metrics |= rollout_metrics(ro, tr.cfg.vapo.group_size, tr.parallel.sum)
    if ro.values is not None:
        metrics |= mc_explained_var(ro, tr.parallel.sum, tr.cfg.vapo.group_size)
        metrics |= explained_var("critic/explained_var_targets", ro.values, ro.returns, ro.loss_mask,
                                 tr.parallel.sum)
    t1 = time.perf_counter()
    updates, mini_size = [], tr.cfg.mini_batch_size // tr.parallel.size
    plan = list(minibatches(tr, ro.size, "policy", tr.rollout_step, tr.cfg.training.ppo_epochs))
    if tr.cfg.rollout.max_off_policy_steps and more_rollouts(tr, len(plan)):
        tr.prefetch.start(tr, "policy", tr.rollout_step + 1)  # sampled from these weights while they update
    for idx in plan:
        if tr.step >= tr.cfg.training.total_steps:
            break
        updates.append(policy_update(tr, ro.rows(idx), first))
        first = None  # only the first mini-batch's first micro-batch was scored before any update
    tr.prefetch.finish()
    tr.replay.add_correct(ro)
    tr.replay.add_pairs(tr.provider.collect(), source="provider")
    tr.rollout_step += 1
    t2 = time.perf_counter()
    if updates:  # means over the updates; their perf/ seconds add up over the step
        metrics |= {k: sum(u[k] for u in updates) / (1 if k.startswith("perf/") else len(updates))
                    for k in updates[0]}
    metrics |= {"vapo/replay_size": len(tr.replay), "vapo/replay_provider": tr.replay.count("provider"),
                "actor/lr": tr.sched_actor.get_last_lr()[0],
                "perf/step_time_s": t2 - t0, "perf/rollout_time_s": t1 - t0, "perf/update_time_s": t2 - t1,
                "perf/sample_time_s": ro.gen_seconds, "perf/old_outputs_time_s": ro.old_seconds,
                "perf/update_samples_per_s": len(updates) * mini_size / max(t2 - t1, 1e-9)}
    metrics |= {"critic/lr": tr.sched_critic.get_last_lr()[0]} if tr.sched_critic is not None else {}
    return tr.parallel.combine(metrics | tr.provider.metrics() | tr.models.backend.metrics())


def policy_update(tr: Trainer, mini: Rollout, first: FirstForward | None = None) -> dict[str, float]:
    """One optimizer step of actor (and critic) on a mini-batch, with replayed positives joining the NLL;
    `first`: the kept forward pass of its first micro-batch (update_step)."""
    replay = None
    if tr.cfg.decisions.positive_replay:
        n = replay_count(int(mini.correct.sum()), tr.cfg.vapo.replay_ratio, len(tr.replay))
        pairs = tr.replay.sample(n, streams.rng(tr.info.seed, "replay", tr.step, tr.parallel.rank))
        replay = from_token_ids(pairs, tr.models.tokenizer.pad_token_id, tr.models.device,
                                temperature=tr.cfg.model.temperature) if pairs else None
    m = update_step(tr.models, tr.opt_actor, tr.opt_critic, mini, replay, tr.spec, parallel=tr.parallel,
                    train_critic=tr.uses_critic, first=first)
    tr.sched_actor.step()
    if tr.sched_critic is not None:
        tr.sched_critic.step()
    tr.step += 1
    m["vapo/positive_samples"] = float(mini.correct.sum())
    m["vapo/replay_samples"] = float(replay.size if replay is not None else 0)
    return m


def rollout_metrics(ro: Rollout, group_size: int, reduce_sum) -> dict[str, float]:
    """Per-sample numbers are means of this rank's share; the token means (entropy, value and return means)
    are global already (`reduce_sum`), because ranks hold different numbers of tokens.
    `rollout/no_signal_groups` only with group_size >= 2: a group of one sample always has equal rewards, so the
    fraction would be 1.0 whatever the rewards are."""
    lengths = ro.lengths.float()

    def token_mean(x: torch.Tensor) -> float:  # over the valid tokens of every rank
        s = reduce_sum(torch.stack([(x * ro.loss_mask).sum(), ro.loss_mask.sum()]).double())
        return float(s[0] / s[1].clamp(min=1))
    out = {"rollout/reward_mean": float(ro.scores.mean()), "rollout/accuracy": float(ro.correct.float().mean()),
           "rollout/response_length": float(lengths.mean()), "rollout/response_length_max": float(lengths.max()),
           "rollout/truncated_frac": float((~ro.finished).float().mean()),
           "rollout/tokens_per_s": float(lengths.sum()) / max(ro.gen_seconds, 1e-9),
           "actor/entropy": token_mean(ro.entropy)}
    if group_size >= 2:  # with one sample per prompt every group trivially has "no signal"
        groups = ro.scores.view(-1, group_size)
        out["rollout/no_signal_groups"] = float((groups.max(1).values == groups.min(1).values).float().mean())
    if ro.weight_version is not None:  # sampled by a remote backend: the version of the weights it held
        out["rollout/weight_version"] = float(ro.weight_version)
    out |= episode_metrics(ro)
    if ro.values is not None and ro.returns is not None:
        out["critic/value_mean"] = token_mean(ro.values)
        out["critic/return_mean"] = token_mean(ro.returns)
    return out


def evaluate_policy(tr: Trainer, on_record) -> dict[str, float]:
    """The held-out evaluation of the current policy (rank 0, or a slice on every rank under fsdp), logged;
    every rank keeps the result. With a critic that has trained (not the start evaluation before value
    pretraining), its held-out EV on the evaluation's sampled responses too (critic.heldout_ev)."""
    c = tr.cfg
    critic_trained = tr.models.value is not None and (tr.pretrain_step > 0 or tr.step > 0 or bool(c.model.value_path))
    m = tr.parallel.evaluate(lambda split: evaluate(
        tr.models, tr.eval_task, num_problems=c.eval.num_problems, samples_per_problem=c.eval.samples_per_problem,
        max_new_tokens=c.model.max_tokens, temperature=c.model.temperature, top_p=c.model.top_p,
        seed=streams.seed_of(tr.info.seed, "eval", tr.step), prompt_format=tr.eval_prompts, split=split,
        on_sampled=heldout_ev(tr.models, c.micro_batch_size, 1 if tr.parallel.sharded else c.eval.samples_per_problem)
        if critic_trained else None, episode=tr.episode, judge=tr.eval_judge))
    on_record(tr.logger.log(tr.step, "eval", m))
    tr.history.last_eval = m
    return m


def save(tr: Trainer) -> None:
    tr.parallel.save(tr.info.run_dir, tr.step, tr.models, tr.opt_actor, tr.opt_critic, tr.state_dict())


def value_only(tr: Trainer, run_dir: Path, on_record, should_stop, t0: float, log) -> dict:
    """`vapo-mcp pretrain-value`: value pretraining alone, then the value model as a HF directory (`<run
    dir>/value_model` or run.json's `value_out`) that runs start from with model.value_path."""
    status = "stopped" if pretrain_value(tr, on_record, should_stop) else "succeeded"
    out = Path(RunDir(run_dir).meta().get("value_out") or run_dir / VALUE_MODEL)
    evs = [e for e in tr.history.pretrain_ev if math.isfinite(e)]
    summary = {"status": status, "mode": VALUE_ONLY, "run_id": tr.info.run_id, "steps": tr.pretrain_step,
               "value_path": str(out), "best_heldout_explained_var": max(evs) if evs else None,
               "last_heldout_explained_var": evs[-1] if evs else None,
               "stopped_early_at": tr.history.pretrain_stopped_at, "seconds": round(time.time() - t0, 1)}
    tr.parallel.save_value_model(tr.models, out)  # collective under fsdp (gathers the shards); rank 0 writes
    if tr.parallel.is_main:
        RunDir(run_dir).write_json(SUMMARY_JSON, summary)
        log(f"value model saved to {out}; start runs from it with --set model.value_path=\"{out}\"")
    return summary


def _summary(tr: Trainer, status: str, final: dict, seconds: float) -> dict:
    start = tr.history.start_eval or {}
    g0, g1 = start.get("eval/greedy_accuracy"), final.get("eval/greedy_accuracy")
    return {"status": status, "run_id": tr.info.run_id, "steps": tr.step, "rollout_steps": tr.rollout_step,
            "start_eval": start, "final_eval": final,
            "greedy_accuracy_gain": None if g0 is None or g1 is None or math.isnan(g1 - g0) else g1 - g0,
            "seconds": round(seconds, 1), "model": tr.models.source}
