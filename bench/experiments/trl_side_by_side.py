"""Our GRPO and VAPO next to TRL's GRPOTrainer: seconds per optimizer step and wall time to +N points (docs/results.md "Next to TRL's GRPOTrainer").

One run each, one after the other in this process: TRL GRPO (`trl.GRPOTrainer`), our GRPO and our VAPO (the `grpo`
and `vapo` variants of vapo_engine.variants, ordinary in-process runs as in bench/lib/runs.py). Needs the optional
extra in its own venv (pyproject.toml's `trl` extra): `pip install -e '.[trl]'`; without it the script exits 2.

The same on all three sides:
- model: the task's built-in tiny model directory (`builtin_model_dir(task=...)`), fp32, CPU, this process;
- shapes (config.toml + preset): batch_size responses per rollout = prompts x group size (TRL num_generations);
  mini_batch_size per optimizer step (TRL per_device_train_batch_size x gradient_accumulation_steps, micro-batch =
  per_device_train_batch_size); batch/mini optimizer steps per rollout (TRL steps_per_generation counts
  micro-batches); ppo_epochs (TRL num_iterations); the same number of optimizer steps;
- sampling: the config's temperature / top_p (1.0 / 1.0 in cpu-demo), top_k off, max new tokens =
  max_completion_length; reward: the task's exact checker `task.reward(text, answer)`; no KL (beta=0, kl_coef=0);
- optimizer: AdamW(lr, weight_decay) with our warm-up-then-constant schedule, handed to TRL via `optimizers=` (so
  HF's default schedule and no-decay groups are not used); gradient clipping at max_grad_norm;
- held-out evaluation: `vapo_engine.rollout.evaluate.evaluate`, same problems and seeds, at step 0, at the first
  rollout boundary past each multiple of eval_interval, and at the end;
- prompts: TRL GRPO, our GRPO and our VAPO get the same sequence (rollout k's prompts come from the trainer's
  policy-prompt stream at k, vapo_engine/trainer/streams.py; TRL shuffle_dataset=False); VAPO's value pretraining
  draws from its own stream, so its policy steps see the same prompts as the others.

Not the same (TRL GRPO vs our GRPO: one algorithm, two implementations):
- generation: TRL's loop (tokenise, `model.generate` with its GenerationConfig, EOS masking, decode) vs
  vapo_engine.rollout.generate (also HF generate with the KV cache, the whole rollout as one batch);
- loss: TRL loss_type="grpo" (token mean per response, then mean over the mini-batch) = our GRPO's
  seq_mean_token_mean, symmetric clip ε = clip_range on both sides; advantage (R − group mean) / (unbiased group
  std + ε), ε = 1e-4 (TRL) vs 1e-6 (ours); TRL also computes per-token entropy in the loss forward and more metrics;
- old log-probs: TRL recomputes them with a forward pass after generation; ours are read off the sampler's
  decoding steps (rollout.old_log_probs = auto on CPU: the same formula, no extra pass; docs/design.md §3.7);
- framework: TRL runs inside HF Trainer + accelerate (callbacks, logging every rollout); activation checkpointing
  off (TRL's default is on), bf16 off, no hub, no reporting.
Our VAPO does more per step than either GRPO: a value model (a second network) scored on every rollout and trained
on every mini-batch, decoupled length-adaptive GAE, Clip-Higher, token-level loss, the positive-example LM loss
with replay — and value pretraining before the first policy step (in its time to +N, not in its s/step).

Measured — s/opt step: ours Σ perf/step_time_s (sample → reward → old log-probs / values → advantages → updates,
logged per rollout) / optimizer steps; TRL Σ (on_step_begin → on_step_end) / optimizer steps (its generation runs
inside the first step of each rollout). Time to +N: training wall time without the held-out evaluations (with value
pretraining, logging, data loading) up to the first evaluation with greedy accuracy ≥ step-0 accuracy + N points.
With --repeats N the sides run N interleaved rounds (TRL, ours, ours, …, then again), so a change of the machine's
load hits every side alike: s/opt step is the median over the rounds, and each side's ratio to TRL GRPO is the
median of the per-round ratios; the curves and time to +N points are the first round's. --small-critic adds our
VAPO with a smaller critic ([critic] settings, e.g. critic.depth_ratio=0.5,critic.width_ratio=0.5) as the side
`vapo_small_critic`. Timings carry the machine's load (the record has the load averages). Nothing here asserts.

    .venv-trl/bin/python -m bench.experiments.trl_side_by_side                       # cpu-demo shapes, builtin:addition
    .venv-trl/bin/python -m bench.experiments.trl_side_by_side --task builtin:chain --preset <its preset>
    .venv-trl/bin/python -m bench.experiments.trl_side_by_side --repeats 3 \
        --small-critic critic.depth_ratio=0.5,critic.width_ratio=0.5       # the issue-24 measurement
    .venv-trl/bin/python -m bench.experiments.trl_side_by_side --smoke --out /tmp/x  # seconds per side
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from bench.lib import plots, records
from bench.lib.runs import PRESET, SMOKE_OVERRIDES, load_bench_config, settings_with_seed

warnings.filterwarnings("ignore", category=FutureWarning)  # TRL 1.16 reads attributes transformers 5.x deprecates

NAME = "trl_side_by_side"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default=None, help="built-in task (default: the preset's data.train)")
    p.add_argument("--preset", default=PRESET, help="preset for shapes and learning rates")
    p.add_argument("--steps", type=int, default=160, help="optimizer steps per run")
    p.add_argument("--eval-interval", type=int, default=8, help="optimizer steps between held-out evaluations")
    p.add_argument("--points", type=float, default=10, help="N: target = step-0 greedy accuracy + N points")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny runs (seconds) to check the script works")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds over the sides")
    p.add_argument("--small-critic", default=None, metavar="KEY=VALUE,...",
                   help="also run our VAPO with these [critic] settings (side vapo_small_critic)")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


SMALL = "vapo_small_critic"


def critic_overrides(args) -> list[str]:
    """The --small-critic settings as overrides; each must be a critic.* key."""
    out = [x.strip() for x in (args.small_critic or "").split(",") if x.strip()]
    bad = [x for x in out if not x.startswith("critic.") or "=" not in x]
    if bad:
        raise SystemExit(f"--small-critic takes critic.KEY=VALUE settings separated by commas, got {bad[0]!r}")
    return out


def require_trl() -> dict:
    try:
        import accelerate
        import datasets
        import trl
    except ImportError:
        print("TRL is not installed: pip install -e '.[trl]' (in its own venv, after pip install torch==2.13.0)",
              file=sys.stderr)
        raise SystemExit(2) from None
    return {"trl": trl.__version__, "accelerate": accelerate.__version__, "datasets": datasets.__version__}


def bench_config(variant: str, args, task: str, model_dir: Path, steps: int, every: int, more: list[str] = ()):
    """config.toml + preset + the variant's overrides + this benchmark's (+ `more`); returns (config, overrides)."""
    extra = [f"training.total_steps={steps}", f"eval.eval_interval={every}", f"eval.save_interval={10 * steps}",
             f"model.local_path={json.dumps(str(model_dir))}", f"data.train={json.dumps(task)}",
             f"eval.benchmark={json.dumps(task)}", *(SMOKE_OVERRIDES if args.smoke else ()), *more]
    return load_bench_config(variant, extra, args.preset)


def heldout(models, task, cfg, seed: int, step: int) -> dict:
    """The trainer's held-out evaluation, with its arguments and seed (vapo_engine.trainer.loop.evaluate_policy)."""
    from vapo_engine.rollout.evaluate import evaluate
    return evaluate(models, task, num_problems=cfg.eval.num_problems, samples_per_problem=cfg.eval.samples_per_problem,
                    max_new_tokens=cfg.model.max_tokens, temperature=cfg.model.temperature, top_p=cfg.model.top_p,
                    seed=seed + 7919 * step)


def steps_per_rollout(cfg) -> int:
    return cfg.training.batch_size // cfg.mini_batch_size * cfg.training.ppo_epochs


def timeline(events: list[tuple[float, dict]]) -> tuple[list[dict], dict[str, float]]:
    """Held-out curve with the training seconds before each evaluation, and the seconds per record kind: the
    interval before each (time, record) event is spent on that record, so evaluations are left out."""
    curve, spent = [], {}
    for (t_prev, _), (t, rec) in pairwise(events):
        if rec["kind"] == "eval":
            buckets = {k.removeprefix("eval/"): v for k, v in rec.items() if k.startswith("eval/greedy_accuracy_")}
            curve.append({"step": rec["step"], "greedy": rec.get("eval/greedy_accuracy"),
                          "sampled": rec.get("eval/sampled_accuracy"), **buckets,
                          "train_s": round(sum(spent.values()), 2)})
        else:
            spent[rec["kind"]] = spent.get(rec["kind"], 0.0) + t - t_prev
    return curve, spent


def run_ours(variant: str, args, task: str, model_dir: Path, steps: int, every: int, side: str | None = None,
             more: list[str] = ()) -> dict:
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    cfg, overrides = bench_config(variant, args, task, model_dir, steps, every, more)
    events = []
    with tempfile.TemporaryDirectory(prefix="vapo-bench-") as tmp:
        info = create_run(cfg, settings_with_seed(args.seed), Path(tmp), run_id=f"{variant}-s{args.seed}",
                          overrides=overrides, preset=args.preset)
        events.append((time.perf_counter(), {"kind": "start"}))
        summary = train(info.run_dir, log=lambda s: None,
                        on_record=lambda r: events.append((time.perf_counter(), r)))
    curve, spent = timeline(events)
    train = [r for _, r in events if r["kind"] == "train"]
    rollouts = [r["perf/step_time_s"] for r in train]
    return {"side": side or variant, "steps": summary["steps"], "overrides": overrides, "curve": curve,
            "train_s": round(sum(spent.values()), 2), "value_pretrain_s": round(spent.get("pretrain", 0.0), 2),
            "step_time_s_sum": round(sum(rollouts), 3), "rollout_times_s": [round(x, 3) for x in rollouts],
            "phases_s": phases(train)}


PHASES = ("sample", "old_outputs", "actor", "critic", "optimizer", "step")
"""Parts of our rollout step (the engine's perf/<phase>_time_s metrics); the rest of perf/step_time_s is
advantages, metrics and the replay buffer."""


def phases(train: list[dict]) -> dict[str, float]:
    """Mean seconds per rollout step in each of PHASES (a phase the side does not run is absent)."""
    out = {}
    for name in PHASES:
        vals = [r[f"perf/{name}_time_s"] for r in train if f"perf/{name}_time_s" in r]
        if vals:
            out[name] = round(statistics.fmean(vals), 4)
    return out


def run_trl(args, task: str, model_dir: Path, steps: int, every: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from vapo_engine.algo.schedule import warmup_constant
    from vapo_engine.rollout.backends.hf import HfBackend
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer import streams

    cfg, _ = bench_config("grpo", args, task, model_dir, steps, every)
    t, task_obj, per_rollout = cfg.training, get_task(task), steps_per_rollout(cfg)
    n_rollouts = -(-steps // per_rollout)  # our trainer's prompts of rollout k (its policy-prompt stream)
    problems = [p for k in range(n_rollouts)
                for p in task_obj.train_batch(cfg.prompts_per_step, streams.rng(args.seed, "policy_prompts", k))]
    data = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])

    def task_reward(completions, answer, **_):
        return [task_obj.reward(c, a) for c, a in zip(completions, answer)]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    opt = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_constant(t.warmup_steps))
    models = SimpleNamespace(policy=model, tokenizer=tokenizer, device=torch.device("cpu"), backend=HfBackend())
    events, step_times = [], []

    class HeldOut(TrainerCallback):
        """Held-out evaluations at our trainer's points; per-optimizer-step timing (evaluation not included)."""

        def _eval(self, step: int) -> None:
            rec = {"kind": "eval", "step": step, **heldout(models, task_obj, cfg, args.seed, step)}
            events.append((time.perf_counter(), rec))  # stamped when the evaluation has finished

        def on_train_begin(self, *a, **k):
            self._eval(0)

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, c, **k):
            now, s = time.perf_counter(), state.global_step
            step_times.append(now - self.t0)
            events.append((now, {"kind": "train", "step": s}))
            if s % per_rollout == 0 and s // every > (s - per_rollout) // every and s < steps:
                self._eval(s)

        def on_train_end(self, *a, **k):
            self._eval(steps)

    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        gcfg = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True,
            logging_steps=per_rollout, seed=args.seed, max_steps=steps, learning_rate=t.learning_rate,
            max_grad_norm=t.max_grad_norm, **{_checkpointing_field(GRPOConfig): False},
            per_device_train_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=cfg.mini_batch_size // cfg.micro_batch_size,
            steps_per_generation=t.batch_size // cfg.micro_batch_size, num_iterations=t.ppo_epochs,
            num_generations=cfg.vapo.group_size, max_completion_length=cfg.model.max_tokens,
            temperature=cfg.model.temperature, top_p=cfg.model.top_p, beta=0.0, epsilon=t.clip_range,
            loss_type="grpo", scale_rewards="group", shuffle_dataset=False)
        trainer = GRPOTrainer(model=model, reward_funcs=task_reward, args=gcfg, train_dataset=data,
                              processing_class=tokenizer, callbacks=[HeldOut()], optimizers=(opt, sched))
        trainer.remove_callback(PrinterCallback)  # its per-log dict printing (disable_tqdm adds it)
        events.append((time.perf_counter(), {"kind": "start"}))
        trainer.train()
    curve, spent = timeline(events)
    return {"side": "trl_grpo", "steps": trainer.state.global_step, "curve": curve,
            "train_s": round(sum(spent.values()), 2),
            "step_time_s_sum": round(sum(step_times), 3), "opt_step_times_s": [round(x, 3) for x in step_times],
            "grpo_config": {k: getattr(gcfg, k) for k in (
                "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                "generation_batch_size", "num_iterations", "num_generations", "max_completion_length",
                "temperature", "top_p", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards")}}


def _checkpointing_field(config_cls) -> str:
    """transformers 5.x renamed gradient_checkpointing (TRL's default: on) to activation_checkpointing."""
    return "activation_checkpointing" if "activation_checkpointing" in config_cls.__dataclass_fields__ \
        else "gradient_checkpointing"


def summarize(run: dict, points: float) -> dict:
    curve = run["curve"]
    start = curve[0]["greedy"]
    target = round(start + points / 100, 6)
    hit = next((p for p in curve if p["greedy"] is not None and p["greedy"] >= target - 1e-9), None)
    return {"s_per_opt_step": round(run["step_time_s_sum"] / max(1, run["steps"]), 4), "steps": run["steps"],
            "start_greedy": start, "final_greedy": curve[-1]["greedy"], "final_sampled": curve[-1]["sampled"],
            "target_greedy": target, "step_to_target": hit and hit["step"], "train_s_to_target": hit and hit["train_s"],
            "train_s_total": run["train_s"], "value_pretrain_s": run.get("value_pretrain_s", 0.0)}


def ratios(summary: dict, rounds: list[dict] | None = None) -> dict:
    """Each side over TRL GRPO (< 1 = faster than TRL): s/opt step as the median of the per-round ratios."""
    base = summary["trl_grpo"]
    out = {}
    for side, s in summary.items():
        per_round = [r[side]["s_per_opt_step"] / r["trl_grpo"]["s_per_opt_step"] for r in rounds or [summary]]
        out[side] = {"s_per_opt_step": round(statistics.median(per_round), 3)}
        if len(per_round) > 1:
            out[side]["s_per_opt_step_rounds"] = [round(x, 3) for x in per_round]
        if s["train_s_to_target"] is not None and base["train_s_to_target"]:
            out[side]["train_s_to_target"] = round(s["train_s_to_target"] / base["train_s_to_target"], 3)
    return out


def print_table(summary: dict, rel: dict, points: float) -> None:
    print(f"{'side':>8} | s/opt step | vs TRL | greedy start → final | step to +{points:g} pts | "
          f"train s to +{points:g} pts | train s total")
    for side, s in summary.items():
        hit = "—" if s["step_to_target"] is None else f"{s['step_to_target']}"
        sec = "—" if s["train_s_to_target"] is None else f"{s['train_s_to_target']:.1f}"
        print(f"{side:>8} | {s['s_per_opt_step']:10.3f} | {rel[side]['s_per_opt_step']:5.2f}× | "
              f"{s['start_greedy']:.3f} → {s['final_greedy']:.3f} | {hit:>15} | {sec:>17} | {s['train_s_total']:.1f}")


def plot(path: Path, runs: list[dict], summary: dict, title: str) -> None:
    plt = plots.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    for r in runs:
        c = r["curve"]
        ax1.plot([p["train_s"] for p in c], [p["greedy"] for p in c], marker="o", ms=3, label=r["side"])
    ax1.axhline(summary["trl_grpo"]["target_greedy"], color="grey", ls="--", lw=1, label="target: start + N points")
    ax1.set(xlabel="training seconds (held-out evaluations excluded)", ylabel="held-out greedy accuracy")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    sides = list(summary)
    ax2.bar(sides, [summary[s]["s_per_opt_step"] for s in sides], color=["C0", "C1", "C2", "C3"][:len(sides)])
    ax2.set(ylabel="seconds per optimizer step")
    fig.suptitle(title, fontsize=10)
    plots.save(fig, path)


def interpreter_command() -> str:
    """records.command_line() names .venv; this script runs in the TRL venv, so name the real interpreter."""
    exe = Path(sys.executable)
    shown = os.path.relpath(exe, records.REPO) if exe.is_relative_to(records.REPO) else str(exe)
    return records.command_line().replace(".venv/bin/python", shown, 1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    versions = require_trl()
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from vapo_engine.builtin_model import builtin_model_dir
    from vapo_engine.config import load_config
    task = args.task or load_config(records.REPO / "config.toml", preset=args.preset).data.train
    steps, every = (2, 1) if args.smoke else (args.steps, args.eval_interval)
    model_dir = builtin_model_dir(task=task)
    t0, load0, small = time.time(), records.load_avg(), critic_overrides(args)
    rounds_runs, loads = [], []
    for _ in range(max(1, args.repeats)):
        loads.append(records.load_avg())
        runs = [run_trl(args, task, model_dir, steps, every)]
        runs += [run_ours(v, args, task, model_dir, steps, every) for v in ("grpo", "vapo")]
        runs += [run_ours("vapo", args, task, model_dir, steps, every, SMALL, small)] if small else []
        rounds_runs.append(runs)
    rounds = [{r["side"]: summarize(r, args.points) for r in runs} for runs in rounds_runs]
    runs, summary = rounds_runs[0], dict(rounds[0])
    for side, s in summary.items():
        per = [r[side]["s_per_opt_step"] for r in rounds]
        summary[side] = s | {"s_per_opt_step": round(statistics.median(per), 4), "s_per_opt_step_rounds": per}
    for side in [r["side"] for r in runs if r.get("phases_s")]:  # each phase: the median over the rounds
        per_round = [r["phases_s"] for round_runs in rounds_runs for r in round_runs if r["side"] == side]
        summary[side]["phases_s"] = {k: round(statistics.median(p[k] for p in per_round), 4) for k in per_round[0]}
    rel = ratios(summary, rounds)
    cfg, _ = bench_config("grpo", args, task, model_dir, steps, every)
    meta = {"task": task, "preset": args.preset, "model_dir": str(model_dir), "steps": steps, "eval_interval": every,
            "points": args.points, "seed": args.seed, "smoke": args.smoke, "versions": versions,
            "repeats": max(1, args.repeats), "order": "interleaved rounds", "small_critic": small,
            "batch_size": cfg.training.batch_size, "group_size": cfg.vapo.group_size,
            "mini_batch_size": cfg.mini_batch_size, "micro_batch_size": cfg.micro_batch_size,
            "opt_steps_per_rollout": steps_per_rollout(cfg), "max_new_tokens": cfg.model.max_tokens,
            "learning_rate": cfg.training.learning_rate, "heldout_problems": cfg.eval.num_problems,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "s_per_opt_step_ours": "Σ perf/step_time_s / optimizer steps",
            "s_per_opt_step_trl": "Σ (on_step_begin → on_step_end) / optimizer steps"}
    record = {"command": interpreter_command(), "config": meta, "wall_s_total": round(time.time() - t0, 1),
              "load_avg_start": load0, "load_avg_end": records.load_avg(), "load_avg_per_round": loads,
              "summary": summary,
              "ratio_vs_trl_grpo": rel, "vapo_step_no_slower_than_trl": rel["vapo"]["s_per_opt_step"] <= 1.0,
              "runs": runs, "later_rounds": [[{k: r[k] for k in ("side", "steps", "step_time_s_sum")}
                                              for r in rr] for rr in rounds_runs[1:]]}
    path = records.write_record(NAME, record, Path(args.out) if args.out else None)
    plot(path.with_suffix(".png"), runs, summary,
         f"TRL GRPO vs our GRPO and VAPO, {task}, {steps} optimizer steps, seed {args.seed}")
    print_table(summary, rel, args.points)
    print(f"our VAPO step / TRL GRPO step = {rel['vapo']['s_per_opt_step']:.2f}; "
          f"wrote {path} and {path.with_suffix('.png')} in {time.time() - t0:.0f} s")
    return json.loads(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
