"""Sample efficiency: VAPO vs vanilla PPO vs GRPO on the built-in addition task (issue 8, bench 2).

Same built-in tiny model, same sample budget (batch 128 = 16 prompts x 8 samples, 4 mini-batches of 32 per
rollout, i.e. 32 responses per policy step) and the same seeds for every algorithm; only the variant's
overrides differ (vapo_engine.variants). Reports held-out accuracy curves (greedy and sampled avg@2 on 200
problems), the first evaluated step reaching a target greedy accuracy, and final accuracy mean ± std and
min–max over seeds. Writes bench/results/sample_efficiency.{json,png}. Sequential runs: on 2 cores parallel
runs only slow each other down.

    .venv/bin/python bench/sample_efficiency.py --steps 200 --seeds 1,2,3   # ~10 min on 2 idle cores
    .venv/bin/python bench/sample_efficiency.py --smoke --out /tmp/x           # seconds, for tests
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ALGOS = ("vapo", "ppo", "grpo")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="policy steps per run (cpu-demo default is 600)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (settings experiment.seed)")
    p.add_argument("--eval-interval", type=int, default=None, help="policy steps between evals (steps/8)")
    p.add_argument("--target", type=float, default=0.90, help="greedy held-out accuracy target")
    p.add_argument("--algos", default=",".join(ALGOS), help="variants to compare")
    p.add_argument("--smoke", action="store_true", help="tiny runs (seconds) to check the script works")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def summarize(runs: list[dict], algos: list[str], target: float, steps: int) -> dict:
    out = {}
    for a in algos:
        mine = [r for r in runs if r["variant"] == a]
        hit = [common.steps_to_target(r["curve"], target) for r in mine]
        out[a] = {"final_greedy": common.spread([r["final_greedy"] for r in mine]),
                  "final_sampled": common.spread([r["final_sampled"] for r in mine]),
                  "start_greedy": common.spread([r["curve"][0]["greedy"] for r in mine if r["curve"]]),
                  "steps_to_target": hit, "reached": sum(h is not None for h in hit), "runs": len(mine),
                  "steps_to_target_mean_reached": (sum(h for h in hit if h is not None) /
                                                   max(1, sum(h is not None for h in hit))) if any(
                      h is not None for h in hit) else None,
                  "mean_explained_var": common.spread([r["mean_explained_var"] for r in mine]),
                  "mean_response_length": common.spread([r["mean_response_length"] for r in mine]),
                  "wall_s": common.spread([r["wall_s"] for r in mine])}
    return out


def save(args, meta: dict, runs: list[dict], t0: float, load0, complete: bool):
    """Write record and plot (after every run, so an interrupted benchmark leaves its finished runs)."""
    algos, steps, seeds = meta["algos"], meta["steps"], meta["seeds"]
    summary = summarize(runs, algos, args.target, steps)
    record = {"config": meta, "complete": complete, "wall_s_total": round(time.time() - t0, 1),
              "load_avg_start": load0, "load_avg_end": common.load_avg(), "summary": summary, "runs": runs}
    path = common.save_training_record("sample_efficiency", record, args.out, runs, algos,
                                       f"VAPO vs PPO vs GRPO, built-in addition, {steps} steps, seeds {seeds} (band = min-max)")
    return path, summary


def main(argv=None) -> dict:
    args = parse_args(argv)
    steps, seeds = (2, [1]) if args.smoke else (args.steps, common.parse_seeds(args.seeds))
    every = 1 if args.smoke else (args.eval_interval or max(1, steps // 8))
    extra = common.SMOKE_OVERRIDES if args.smoke else ()
    algos = [a for a in args.algos.split(",") if a]
    t0, load0, runs = time.time(), common.load_avg(), []
    meta = {"preset": common.PRESET, "steps": steps, "seeds": seeds, "eval_interval": every,
            "target_greedy": args.target, "algos": algos, "smoke": args.smoke, "extra_overrides": list(extra)}
    for seed in seeds:
        for a in algos:
            r = common.run_variant(a, seed, steps, every, extra)
            runs.append(r)
            print(f"{a:>5} seed {seed}: greedy {r['curve'][0]['greedy']:.3f} -> {r['final_greedy']:.3f}, "
                  f"sampled {r['final_sampled']:.3f}, EV {r['mean_explained_var']}, {r['wall_s']:.0f} s",
                  flush=True)
            path, summary = save(args, meta, runs, t0, load0, len(runs) == len(seeds) * len(algos))
    print_table(summary, args.target)
    print(f"wrote {path} and {path.with_suffix('.png')} in {time.time() - t0:.0f} s")
    return json.loads(path.read_text(encoding="utf-8"))


def print_table(summary: dict, target: float) -> None:
    print(f"{'algo':>5} | final greedy mean±std [min–max] | final sampled mean±std | steps to {target:.2f}")
    for a, s in summary.items():
        g, sp = s["final_greedy"], s["final_sampled"]
        print(f"{a:>5} | {g['mean']:.3f}±{g['std']:.3f} [{g['min']:.3f}–{g['max']:.3f}] | "
              f"{sp['mean']:.3f}±{sp['std']:.3f} | {s['steps_to_target']}")


if __name__ == "__main__":
    main()
