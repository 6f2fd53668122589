"""Ablation: full VAPO and every "w/o X" variant of docs/design.md §3, plus PPO / GRPO / DAPO baselines (docs/results.md, the paired ablation).

Same built-in tiny model, task, sample budget and seeds for every row; a variant is the cpu-demo recipe plus
its overrides from vapo_engine.variants. The table is shaped like the paper's ablation (AIME 2024 avg@32,
Qwen2.5-32B, ~5,000 steps); the paper's number is printed beside ours only for orientation — it is a
different model, a different benchmark and a ~100x longer run, so the two columns are not comparable.

    .venv/bin/python -m bench.experiments.ablation --reduced --reuse bench/results/sample_efficiency.json
    .venv/bin/python -m bench.experiments.ablation    # full: 600 steps x seeds 1,2,3 x 11 variants: ~6-8 h
    .venv/bin/python -m bench.experiments.ablation --smoke --out /tmp/x

(`--reduced`: 200 steps, seed 1, ~25 min.)

`--reuse bench/results/sample_efficiency.json` takes the vapo / ppo / grpo runs with the same steps, seed and
eval interval from that record instead of training them again (the runs are identical configurations).

**Sample efficiency** (`--sample-efficiency`): VAPO vs vanilla PPO vs GRPO on the cpu-demo recipe (variants
vapo,ppo,grpo unless `--variants`, 200 steps unless `--steps`), the same runs as the ablation's rows, written as
the record `sample_efficiency` with one summary per algorithm (final accuracy mean ± std and min–max over seeds,
the first evaluated step reaching `--target`):

    .venv/bin/python -m bench.experiments.ablation --sample-efficiency --steps 200 --seeds 1,2,3  # ~10 min

**The paired design** (`--budget R`, bench/lib/paired.py): every row of a seed spends R rollouts, value-pretraining
rollouts included. Rows that pretrain a critic share one per seed, trained once (`vapo-mcp pretrain-value`'s
value-only run, then `model.value_path`), and have R − P rollouts left for policy steps, P = the rounds that
critic took; rows of a seed draw identical policy-step prompts (trainer/streams.py). The primary metric is the
area under the held-out curve over the budget (`--metric`, default sampled accuracy), with the rollouts to
`--target` beside it; each row is compared with VAPO seed by seed, Holm-corrected over the rows:

    .venv/bin/python -m bench.experiments.ablation --preset chain-noisy-sft --budget 20 --seeds 1,2,3,4,5 --target 0.6 \
        --variants vapo,grpo,rft,no_value_pretrain,no_decoupled_gae,no_length_adaptive,no_positive_lm \
        --eval-interval 4 --set eval.benchmark=builtin:chain-long --set eval.num_problems=96 \
        --set eval.samples_per_problem=1 --set vapo.value_pretrain_steps=4 --set vapo.value_pretrain_patience=0 \
        --jobs 2 --name ablation_chain_paired

Rows run one after another (every seed of a row, `--jobs` at a time); each finished run is kept in
bench/.cache/cells, so the same command after an interruption continues where it stopped, and a design cut
short can be written with `--variants` naming the rows that finished.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.lib import paired, plots, records
from bench.lib.runs import (
    PRESET,
    SMOKE_OVERRIDES,
    load_bench_config,
    parse_seeds,
    run_variant,
    settings_with_seed,
    steps_to_target,
)
from bench.lib.stats import spread, welch_ci
from vapo_engine.variants import DEFAULT_ABLATION, VARIANTS

ROWS = (*DEFAULT_ABLATION, "dapo")
OFFLINE = "vapo_offline_critic"
"""A row of the paired design only: full VAPO from a critic pretrained once, offline, for `--offline-critic-rounds`
rollouts of the initial policy (seed OFFLINE_SEED, a prompt stream no row draws), and reused by every seed: its
whole budget goes to policy steps; the critic's rollouts are reported beside the table, not counted in it (a user
who runs many jobs from one base model pays them once)."""
OFFLINE_SEED = 1000
SAMPLE_EFFICIENCY = ("vapo", "ppo", "grpo")
MODULE = "bench.experiments.ablation"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reduced", action="store_true", help="200 steps, seed 1 (minutes, not hours)")
    p.add_argument("--sample-efficiency", action="store_true", help="VAPO, PPO and GRPO side by side: the record "
                   "sample_efficiency with one summary per algorithm (variants vapo,ppo,grpo, 200 steps by default)")
    p.add_argument("--steps", type=int, default=None, help="policy steps per run (full 600, reduced and "
                   "--sample-efficiency 200)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (full 1,2,3, reduced 1)")
    p.add_argument("--eval-interval", type=int, default=None, help="policy steps between evals (steps/8)")
    p.add_argument("--target", type=float, default=0.90, help="greedy held-out accuracy target")
    p.add_argument("--variants", default=None, help="variant names (vapo_engine.variants; default: every ablation "
                   "row, or vapo,ppo,grpo with --sample-efficiency)")
    p.add_argument("--reuse", default=None, help="records (comma-separated JSON paths) whose matching runs are reused")
    p.add_argument("--preset", default=PRESET, help="preset of every row (cpu-demo: builtin:addition; "
                   "chain-noisy-sft: builtin:chain, where the long end is the headline metric)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every row (repeatable), e.g. training.learning_rate=2e-4; "
                        "recorded in the record's config.extra_overrides")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once, each in its own process with "
                   "cores // jobs torch threads (2 runs at once on 2 cores: ~1.5x the throughput of one, bench/perf/concurrency.py)")
    p.add_argument("--budget", type=int, default=None, help="the paired design: rollouts per row, value-pretraining "
                   "rollouts included (one shared critic per seed); replaces --steps")
    p.add_argument("--metric", default="sampled", choices=("sampled", "greedy"), help="held-out curve of the paired "
                   "design's area and threshold (sampled = avg@k at the training temperature)")
    p.add_argument("--critic-dir", default=str(records.REPO / "bench" / ".cache" / "critics"),
                   help="where the paired design keeps its shared critics (reused when their settings match)")
    p.add_argument("--offline-critic-rounds", type=int, default=32, help=f"value-pretraining rollouts of the critic of "
                   f"the row {OFFLINE} (paired design; pretrained once, reused by every seed, not in the budget)")
    p.add_argument("--name", default=None, help="record name (default ablation[_<preset>][_paired])")
    p.add_argument("--pretrain-only", action="store_true", help=argparse.SUPPRESS)  # a --jobs child: one critic
    p.add_argument("--smoke", action="store_true", help="tiny runs (seconds) to check the script works")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    a = p.parse_args(argv)
    a.variants = a.variants or ",".join(SAMPLE_EFFICIENCY if a.sample_efficiency else ROWS)
    return a


def plan(args) -> tuple[int, list[int], int, tuple[str, ...]]:
    if args.smoke:  # 2 steps, evaluated at the start and the end
        return 2, parse_seeds(args.seeds or "1"), 2, (*SMOKE_OVERRIDES, *args.overrides)
    steps = args.steps or (200 if args.reduced or args.sample_efficiency else 600)
    seeds = parse_seeds(args.seeds or ("1" if args.reduced else "1,2,3"))
    return steps, seeds, args.eval_interval or max(1, steps // 8), tuple(args.overrides)


def reusable(paths: str | None, steps: int, every: int, preset: str = PRESET,
             extra: tuple[str, ...] = ()) -> dict[tuple[str, int], dict]:
    """Runs of other records (comma-separated paths) trained with exactly this budget and these extra overrides,
    by (variant, seed); the first path that has a run wins."""
    found: dict[tuple[str, int], dict] = {}
    for path in [p for p in (paths or "").split(",") if p and Path(p).is_file()]:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
        cfg = rec.get("config", {})
        if (cfg.get("steps") != steps or cfg.get("eval_interval") != every
                or list(cfg.get("extra_overrides") or []) != list(extra)
                or cfg.get("smoke") or cfg.get("mode") == "smoke" or cfg.get("preset") != preset):
            continue
        for r in rec.get("runs", []):
            found.setdefault((r["variant"], r["seed"]), {**r, "reused_from": r.get("reused_from", path)})
    return found


def summarize(runs: list[dict], variants: list[str], target: float) -> list[dict]:
    base = spread([r["final_greedy"] for r in runs if r["variant"] == "vapo"])["mean"]
    ref = [r for r in runs if r["variant"] == "vapo"]
    rows = []
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        g = spread([r["final_greedy"] for r in mine])
        deltas = {f"vs_vapo_{k}": welch_ci([r.get(k) for r in mine], [r.get(k) for r in ref])
                  for k in ("final_greedy", "final_greedy_long", "final_greedy_mid", "final_sampled",
                            "mean_explained_var") if any(r.get(k) is not None for r in mine)}
        rows.append({"variant": v, "description": VARIANTS[v].description, "paper_aime24": VARIANTS[v].paper_aime,
                     "final_greedy": g, "final_sampled": spread([r["final_sampled"] for r in mine]),
                     **{f"final_greedy_{b}": spread([r.get(f"final_greedy_{b}") for r in mine])
                        for b in ("short", "mid", "long") if any(f"final_greedy_{b}" in r for r in mine)},
                     "start_greedy_long": spread([(r["curve"][0] if r["curve"] else {}).get("greedy_long")
                                                         for r in mine]),
                     **deltas,
                     "delta_greedy_vs_vapo": None if base is None or g["mean"] is None else round(g["mean"] - base, 4),
                     "steps_to_target": [steps_to_target(r["curve"], target) for r in mine],
                     "mean_explained_var": spread([r["mean_explained_var"] for r in mine])["mean"],
                     "mean_lambda_policy": spread([r["mean_lambda_policy"] for r in mine])["mean"],
                     "mean_response_length": spread([r["mean_response_length"] for r in mine])["mean"],
                     "wall_s": spread([r["wall_s"] for r in mine])["mean"]})
    return rows


def save(args, meta: dict, runs: list[dict], t0: float, load0, complete: bool):
    """Write the record (after every run, so an interrupted ablation still leaves its finished rows)."""
    done = [v for v in meta["variants"] if any(r["variant"] == v for r in runs)]
    rows = summarize(runs, done, args.target)
    record = {"config": meta, "complete": complete, "wall_s_total": round(time.time() - t0, 1),
              "load_avg_start": load0, "load_avg_end": records.load_avg(),
              "paper_note": "paper_aime24 = AIME 2024 avg@32 of Qwen2.5-32B after ~5,000 steps (VAPO paper, "
                            "arXiv 2504.05118); a different model and benchmark, shown for orientation only",
              "table": rows, "runs": runs}
    path = records.save_training_record(record_name(meta["preset"]), record, args.out, runs, done,
                                       f"VAPO ablation, preset {meta['preset']}, {meta['steps']} steps, "
                                       f"seeds {meta['seeds']}")
    return path, rows


def summarize_algorithms(runs: list[dict], algos: list[str], target: float) -> dict:
    """The sample-efficiency summary, per algorithm: final accuracies, the step each run reached `target` at,
    and the spread over seeds of its explained variance, response length and wall time."""
    out = {}
    for a in algos:
        mine = [r for r in runs if r["variant"] == a]
        hit = [steps_to_target(r["curve"], target) for r in mine]
        reached = [h for h in hit if h is not None]
        out[a] = {"final_greedy": spread([r["final_greedy"] for r in mine]),
                  "final_sampled": spread([r["final_sampled"] for r in mine]),
                  "start_greedy": spread([r["curve"][0]["greedy"] for r in mine if r["curve"]]),
                  "steps_to_target": hit, "reached": len(reached), "runs": len(mine),
                  "steps_to_target_mean_reached": sum(reached) / len(reached) if reached else None,
                  "mean_explained_var": spread([r["mean_explained_var"] for r in mine]),
                  "mean_response_length": spread([r["mean_response_length"] for r in mine]),
                  "wall_s": spread([r["wall_s"] for r in mine])}
    return out


def save_sample_efficiency(args, meta: dict, runs: list[dict], t0: float, load0, complete: bool):
    """Write the sample-efficiency record and plot (after every run, like `save`)."""
    summary = summarize_algorithms(runs, meta["algos"], args.target)
    record = {"config": meta, "complete": complete, "wall_s_total": round(time.time() - t0, 1),
              "load_avg_start": load0, "load_avg_end": records.load_avg(), "summary": summary, "runs": runs}
    path = records.save_training_record("sample_efficiency", record, args.out, runs, meta["algos"],
                                        f"VAPO vs PPO vs GRPO, built-in addition, {meta['steps']} steps, seeds "
                                        f"{meta['seeds']} (band = min-max)")
    return path, summary


LINEAR = "vapo_linear_critic"
"""A row of the paired design only: full VAPO with the hidden-state critic (critic.head = "linear"), for presets
whose critic is the surprise head: what the head changes, everything else equal."""
BENCH_ROWS = {OFFLINE: ("vapo", ()), LINEAR: ("vapo", ('critic.head="linear"',))}
"""Rows that are a variant of vapo_engine.variants plus overrides: name -> (variant, overrides)."""


def config_variant(row: str) -> str:
    """The variant whose config a row trains with (the bench-only rows are VAPO's)."""
    return BENCH_ROWS[row][0] if row in BENCH_ROWS else row


def row_overrides(row: str) -> tuple[str, ...]:
    """The overrides a bench-only row adds to its variant's (none for a plain variant)."""
    return BENCH_ROWS[row][1] if row in BENCH_ROWS else ()


def record_name(preset: str) -> str:
    return "ablation" if preset == PRESET else f"ablation_{preset.removesuffix('-demo')}"


def run_cells(args, cells: list[tuple[str, int]], steps: int, every: int, extra: tuple[str, ...],
              per_cell: dict | None = None, on_done=None) -> dict[tuple[str, int], dict]:
    """Train `cells` ((variant, seed) pairs) `args.jobs` at a time, each in a process of this module with
    cores // jobs torch threads; returns each cell's run. `per_cell` {cell: (steps, extra overrides)} replaces
    the common steps / adds overrides for a cell. A failed cell stops the ablation with its stderr."""
    def argv(cell) -> list[str]:
        n, more = (per_cell or {}).get(cell, (steps, ()))
        budget = ["--smoke"] if args.smoke and not per_cell else ["--steps", str(n), "--eval-interval", str(every)]
        return ["--preset", args.preset, *budget, *[x for o in (*extra, *more) for x in ("--set", o)],
                "--seeds", str(cell[1]), "--variants", config_variant(cell[0])]
    return _children(args, cells, argv, lambda out: json.loads(
        (out / f"{record_name(args.preset)}.json").read_text(encoding="utf-8"))["runs"][0], on_done)


def _children(args, cells: list, argv, result, on_done=None) -> dict:
    """Run this module once per cell (`argv(cell) + --out DIR`), `args.jobs` at a time, each with cores // jobs
    torch threads (the run manager's budget); `result(DIR)` reads what a child wrote."""
    from vapo_engine.jobs.threads import worker_env
    env = worker_env(concurrent=args.jobs)
    with tempfile.TemporaryDirectory(prefix="vapo-ablation-") as tmp:
        def one(cell) -> dict:
            out = Path(tmp) / "-".join(map(str, cell if isinstance(cell, tuple) else (cell,)))
            r = subprocess.run([sys.executable, "-m", MODULE, *argv(cell), "--out", str(out)], cwd=records.REPO,
                               env=env, capture_output=True, text=True, check=False)
            if r.returncode:
                raise RuntimeError(f"ablation cell {cell} failed:\n{r.stderr[-3000:]}")
            return result(out)

        done = {}
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {pool.submit(one, c): c for c in cells}
            for f in as_completed(futures):
                done[futures[f]] = f.result()
                if on_done:
                    on_done(futures[f], done[futures[f]])
                print(f"  finished {futures[f]} ({len(done)}/{len(cells)})", flush=True)
        return done


def cell_cache(args, cell: tuple[str, int], steps: int, every: int, overrides: tuple[str, ...]) -> Path:
    """Where a finished run of the paired design is kept (next to the critics), keyed by everything that
    defines it, so an interrupted ablation restarts where it stopped. Code changes are not in the key: clear
    bench/.cache after changing the trainer."""
    key = json.dumps({"preset": args.preset, "cell": list(cell), "steps": steps, "every": every,
                      "overrides": list(overrides), "smoke": args.smoke}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(args.critic_dir).parent / "cells" / f"{cell[0]}-s{cell[1]}-{digest}.json"


def _keep(path: Path, run: dict) -> dict:
    from vapo_engine.rundir import write_json_atomic
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, run)
    return run


def critic_dir(args, seed: int, extra: tuple[str, ...]) -> Path:
    """The shared critic of `seed` under these settings (preset, every-row overrides, smoke)."""
    key = json.dumps({"preset": args.preset, "extra": list(extra), "seed": seed, "smoke": args.smoke}, sort_keys=True)
    return Path(args.critic_dir) / f"critic-s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def offline_extra(args, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The settings of the offline critic: the rows' overrides with `--offline-critic-rounds` rounds, no plateau stop."""
    return (*extra, f"vapo.value_pretrain_steps={args.offline_critic_rounds}", "vapo.value_pretrain_patience=0")


def pretrain_critic(args, seed: int, extra: tuple[str, ...]) -> dict:
    """Value pretraining alone (the value-only run of `vapo-mcp pretrain-value`) with the VAPO row's config and
    `seed`; the value model and `critic.json` (rounds, rollouts, held-out EV per round, wall time) go to
    `critic_dir`. Reused when already there."""
    from vapo_engine.rundir import RunDir
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    out = critic_dir(args, seed, extra)
    if (out / "critic.json").is_file():
        return json.loads((out / "critic.json").read_text(encoding="utf-8"))
    config, overrides = load_bench_config("vapo", extra, args.preset)
    with tempfile.TemporaryDirectory(prefix="vapo-critic-") as tmp:
        info = create_run(config, settings_with_seed(seed), Path(tmp), run_id=f"critic-s{seed}",
                          overrides=overrides, preset=args.preset,
                          extra={"mode": "value_pretrain", "value_out": str(out / "value_model")})
        t0 = time.perf_counter()
        summary = train(info.run_dir, log=lambda m: None)
        recs = [r for r in RunDir(info.run_dir).metrics() if r["kind"] == "pretrain"]
        evs = [r.get("critic/pretrain_explained_var") for r in recs]
        within = [r.get("critic/pretrain_explained_var_within_prompt") for r in recs]
    meta = {"seed": seed, "path": str(out / "value_model"), "rounds": summary["steps"], "rollouts": summary["steps"],
            "responses": summary["steps"] * config.training.batch_size, "heldout_explained_var": evs,
            "heldout_explained_var_within_prompt": within,
            "wall_s": round(time.perf_counter() - t0, 1), "overrides": overrides}
    (out / "critic.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def shared_critics(args, seeds: list[int], extra: tuple[str, ...], more: tuple[str, ...] = ()) -> dict[int, dict]:
    """One pretrained critic per seed (`--jobs` at a time in child processes), reused across rows and runs;
    `more`: a bench-only row's own overrides (its critic is its own)."""
    todo = [s for s in seeds if not (critic_dir(args, s, (*extra, *more)) / "critic.json").is_file()]
    if args.jobs > 1 and len(todo) > 1:
        _children(args, todo, lambda s: ["--pretrain-only", "--preset", args.preset, "--seeds", str(s),
                                         *(["--smoke"] if args.smoke else []),
                                         *[x for o in (*args.overrides, *more) for x in ("--set", o)],
                                         "--critic-dir", args.critic_dir], lambda out: None)
    return {s: pretrain_critic(args, s, (*extra, *more)) for s in seeds}


def critic_key(row: str, seed: int) -> str:
    """The record's key of the critic a row of `seed` starts from: the seed (VAPO's, shared by every row that
    pretrains), `<seed>:<row>` for a bench-only row with its own critic settings, or OFFLINE."""
    return OFFLINE if row == OFFLINE else f"{seed}:{row}" if row_overrides(row) else str(seed)


def reusable_budget(paths: str | None, meta: dict) -> tuple[dict, dict, list[float]]:
    """Runs (by (variant, seed)), critics (by seed) and invocation wall times of earlier paired records made with
    exactly this design (preset, budget, eval interval, every-row overrides): seeds or rows can be added later."""
    runs, critics, walls = {}, {}, []
    keys = ("preset", "budget_rollouts", "eval_interval", "extra_overrides", "metric", "smoke")
    for path in [p for p in (paths or "").split(",") if p and Path(p).is_file()]:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
        if rec.get("design") != "paired_budget" or any(rec["config"].get(k) != meta[k] for k in keys):
            continue
        for r in rec["runs"]:
            runs.setdefault((r["variant"], r["seed"]), {**r, "reused_from": r.get("reused_from", path)})
        critics |= {s: c for s, c in rec.get("critics", {}).items() if s not in critics}
        walls += rec["wall_s_invocations"]
    return runs, critics, walls


def run_budget(args, seeds: list[int], variants: list[str], every: int, extra: tuple[str, ...],
               old: dict | None = None, old_critics: dict | None = None) -> tuple[list[dict], dict]:
    """The paired design: rows spend `args.budget` rollouts each, shared value pretraining included; `old` runs
    (and their critics) are taken as they are. Returns the runs and the critics by seed."""
    old, old_critics = old or {}, old_critics or {}
    critics = {k: c for k, c in old_critics.items()}
    for row in ["vapo", *(v for v in variants if v in BENCH_ROWS and v != OFFLINE)]:  # each its per-seed critics
        fresh = [s for s in seeds if critic_key(row, s) not in critics]
        critics |= {critic_key(row, s): c for s, c in shared_critics(args, fresh, extra, row_overrides(row)).items()}
    if OFFLINE in variants:  # pretrained once (cached like the others), outside every row's budget
        critics[OFFLINE] = old_critics.get(OFFLINE) or pretrain_critic(args, OFFLINE_SEED, offline_extra(args, extra))
    base, _ = load_bench_config("vapo", extra, args.preset)
    upr = base.training.batch_size // base.mini_batch_size * base.training.ppo_epochs
    cells = {}
    for v in variants:  # row by row: an interrupted design leaves whole rows (every seed) in the cell cache
        for seed in seeds:
            if (v, seed) in old:
                continue
            if v == OFFLINE:
                c = critics[OFFLINE]
                cells[v, seed] = (args.budget * upr, (f"model.value_path={json.dumps(c['path'])}",
                                                      "vapo.value_pretrain_steps=0"), None)
                continue
            own = row_overrides(v)
            uses = load_bench_config(config_variant(v), (*extra, *own), args.preset)[0].decisions.value_pretrain_steps > 0
            c = critics.get(critic_key(v, seed))
            if uses and c["rollouts"] >= args.budget:
                raise SystemExit(f"--budget {args.budget} is used up by value pretraining ({c['rollouts']} rounds, "
                                 f"seed {seed}): raise --budget or lower vapo.value_pretrain_steps")
            more = (*own, *((f"model.value_path={json.dumps(c['path'])}", "vapo.value_pretrain_steps=0") if uses
                            else ()))
            cells[v, seed] = ((args.budget - (c["rollouts"] if uses else 0)) * upr, more, c if uses else None)
    cached = {k: cell_cache(args, k, n, every, (*extra, *m)) for k, (n, m, _) in cells.items()}
    done = {k: json.loads(f.read_text(encoding="utf-8")) for k, f in cached.items() if f.is_file()}
    todo = [k for k in cells if k not in done]
    if args.jobs > 1:
        done |= run_cells(args, todo, 0, every, extra, {k: cells[k][:2] for k in todo},
                          on_done=lambda k, r: _keep(cached[k], r))
    else:
        for k in todo:
            n, m, _ = cells[k]
            done[k] = _keep(cached[k], run_variant(config_variant(k[0]), k[1], n, every, (*extra, *m),
                                                    preset=args.preset))
    for (v, seed), (n, _, c) in cells.items():
        done[v, seed].update(variant=v, pretrain_rollouts=c["rollouts"] if c else 0, updates_per_rollout=upr,
                             shared_critic=None if c is None else {k: c[k] for k in ("rounds", "responses", "wall_s")}
                             | {"last_heldout_explained_var": (c["heldout_explained_var"] or [None])[-1]})
    runs = [old.get((v, s)) or done[v, s] for s in seeds for v in variants]
    for r in runs:
        print(f"{r['variant']:>20} seed {r['seed']}: {args.metric} {r['curve'][0][args.metric]:.3f} -> "
              f"{r['curve'][-1][args.metric]:.3f}, {r['wall_s']:.0f} s" + (" (reused)" if "reused_from" in r else ""),
              flush=True)
    return runs, critics


def save_budget(args, meta: dict, runs: list[dict], critics: dict, t0: float, load0, walls: list) -> Path:
    table = paired.compare(runs, meta["variants"], args.metric, args.budget, args.target)
    wall = round(time.time() - t0, 1)
    work = sum(r["wall_s"] for r in runs) + sum(c.get("wall_s", 0) for c in critics.values())
    record = {"config": meta, "complete": True, "wall_s_total": wall, "wall_s_invocations": [*walls, wall],
              "wall_s_runs_and_critics_sum": round(work, 1),  # the design's work, also when runs came from the cache
              "load_avg_start": load0, "load_avg_end": records.load_avg(), "design": "paired_budget",
              "critics": {str(s): c for s, c in critics.items()}, "table": table, "runs": runs,
              "bench_rows": {k: {"variant": v, "overrides": list(o)} for k, (v, o) in BENCH_ROWS.items()
                             if k in meta["variants"]},
              "paper_note": "paper_aime24 = AIME 2024 avg@32 of Qwen2.5-32B after ~5,000 steps (VAPO paper, "
                            "arXiv 2504.05118); a different model and benchmark, shown for orientation only"}
    name = args.name or record_name(meta["preset"]) + "_paired"
    path = records.write_record(name, record, Path(args.out) if args.out else None)
    plots.plot_budget(path.with_suffix(".png"), runs, meta["variants"], args.metric, args.budget,
                f"paired ablation, preset {meta['preset']}, {args.budget} rollouts per row, seeds {meta['seeds']}")
    return path


def main(argv=None) -> dict:
    args = parse_args(argv)
    steps, seeds, every, extra = plan(args)
    if args.pretrain_only:
        return pretrain_critic(args, seeds[0], extra)
    if args.budget:
        variants = [v for v in args.variants.split(",") if v]
        t0, load0 = time.time(), records.load_avg()
        meta = {"preset": args.preset, "budget_rollouts": args.budget, "seeds": seeds, "eval_interval": every,
                "metric": args.metric, "threshold": args.target, "variants": variants, "extra_overrides": list(extra),
                "smoke": args.smoke, "reuse": args.reuse, "jobs": args.jobs}
        old, old_critics, walls = reusable_budget(args.reuse, meta)
        runs, critics = run_budget(args, seeds, variants, every, extra, old, old_critics)
        path = save_budget(args, meta, runs, critics, t0, load0, walls)
        print(f"wrote {path} and {path.with_suffix('.png')} in {time.time() - t0:.0f} s")
        return json.loads(path.read_text(encoding="utf-8"))
    variants = [v for v in args.variants.split(",") if v]
    old = reusable(args.reuse, steps, every, args.preset, extra) if not args.smoke else {}
    t0, load0, runs = time.time(), records.load_avg(), []
    if args.sample_efficiency:
        meta = {"preset": args.preset, "steps": steps, "seeds": seeds, "eval_interval": every,
                "target_greedy": args.target, "algos": variants, "smoke": args.smoke, "extra_overrides": list(extra)}
    else:
        meta = {"preset": args.preset, "mode": "smoke" if args.smoke else ("reduced" if args.reduced else "full"),
                "steps": steps, "seeds": seeds, "eval_interval": every, "target_greedy": args.target,
                "variants": variants, "extra_overrides": list(extra), "reuse": args.reuse}
    write = save_sample_efficiency if args.sample_efficiency else save
    total = len(seeds) * len(variants)
    if args.jobs > 1:
        fresh = run_cells(args, [(v, s) for s in seeds for v in variants if (v, s) not in old], steps, every, extra)
        old = {**old, **fresh}
    for seed in seeds:
        for v in variants:
            r = old.get((v, seed)) or run_variant(v, seed, steps, every, extra, preset=args.preset)
            runs.append(r)
            tag = " (reused)" if "reused_from" in r else ""
            print(f"{v:>20} seed {seed}: greedy {r['curve'][0]['greedy']:.3f} -> {r['final_greedy']:.3f}, "
                  f"sampled {r['final_sampled']:.3f}, {r['wall_s']:.0f} s{tag}", flush=True)
            path, rows = write(args, meta, runs, t0, load0, complete=len(runs) == total)
    if args.sample_efficiency:
        print_summary(rows, args.target)
    else:
        for row in rows:
            g = row["final_greedy"]
            print(f"{row['variant']:>20} | paper AIME {row['paper_aime24']} | ours greedy {g['mean']:.3f} "
                  f"(Δ {row['delta_greedy_vs_vapo']}) | EV {row['mean_explained_var']}")
    print(f"wrote {path} and {path.with_suffix('.png')} in {time.time() - t0:.0f} s")
    return json.loads(path.read_text(encoding="utf-8"))


def print_summary(summary: dict, target: float) -> None:
    """The sample-efficiency table on stdout."""
    print(f"{'algo':>5} | final greedy mean±std [min–max] | final sampled mean±std | steps to {target:.2f}")
    for a, s in summary.items():
        g, sp = s["final_greedy"], s["final_sampled"]
        print(f"{a:>5} | {g['mean']:.3f}±{g['std']:.3f} [{g['min']:.3f}–{g['max']:.3f}] | "
              f"{sp['mean']:.3f}±{sp['std']:.3f} | {s['steps_to_target']}")


if __name__ == "__main__":
    main()
