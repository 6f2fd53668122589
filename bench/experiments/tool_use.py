"""Tool use (docs/design.md §3.14): does RL with a calculator (an MCP server over stdio) teach the built-in model to call it, and
does held-out accuracy follow — next to the same runs without the tool?

Preset `tools-crates`: the built-in model `builtin:crates`, whose warm start calls the calculator on 30% of the
problems on purpose (tasks/crates.py), trained on products of two 2-digit numbers asked in words. Four arms per
seed, the same seed and number of policy steps: VAPO and GRPO (baselines.grpo's overrides) with the calculator
(`rollout.episode = "tool_calls"`, `vapo-mcp tool-server calculator` over stdio), and the same two without it
(`rollout.episode = "single_turn"`: the policy's calls reach nothing, and whatever it writes after one is its own).
Each run is evaluated with its own episode. Records, per run: the held-out greedy and sampled accuracy and the
greedy episodes' tool calls per problem at each evaluation, and per training step rollout/tool_use,
rollout/tool_calls, rollout/tool_errors, rollout/turns and rollout/accuracy. Writes bench/results/tool_use.{json,png}.

    .venv/bin/python -m bench.experiments.tool_use                      # ~15 min on 2 idle cores
    .venv/bin/python -m bench.experiments.tool_use --smoke --out /tmp/x  # a minute, for tests
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.lib import records
from bench.lib.runs import SMOKE_OVERRIDES, parse_seeds, run_variant
from vapo_engine.rundir import RunDir

PRESET = "tools-crates"
ARMS = (("vapo", True), ("grpo", True), ("vapo", False), ("grpo", False))
TRAIN_KEYS = ("rollout/tool_use", "rollout/tool_calls", "rollout/tool_errors", "rollout/turns", "rollout/accuracy",
              "rollout/response_length", "rollout/policy_tokens")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="policy steps of each run")
    p.add_argument("--seeds", default="42", help="comma-separated seeds")
    p.add_argument("--eval-interval", type=int, default=15, help="policy steps between evaluations")
    p.add_argument("--smoke", action="store_true", help="tiny runs to check the script works")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def arm_name(variant: str, tools: bool) -> str:
    return f"{variant} {'with' if tools else 'without'} the calculator"


def one_run(variant: str, tools: bool, seed: int, args) -> dict:
    extra = ("rollout.episode=tool_calls" if tools else "rollout.episode=single_turn",
             *(SMOKE_OVERRIDES + ("eval.num_problems=8",) if args.smoke else ()))
    with tempfile.TemporaryDirectory(prefix="vapo-bench-tools-") as keep:
        run = run_variant(variant, seed, args.steps, args.eval_interval, extra, preset=PRESET, keep_in=Path(keep),
                          name=f"{variant}-{'tools' if tools else 'none'}-s{seed}",
                          log=lambda s: print(f"[{variant} tools={tools} s{seed}] {s}", flush=True))
        metrics = RunDir(Path(run["run_dir"])).metrics()
    run["run_dir"] = None
    calls = {int(r["step"]): r.get("eval/greedy_tool_calls") for r in metrics if r.get("kind") == "eval"}
    for point in run["curve"]:
        point["greedy_tool_calls"] = calls.get(point["step"])
    run["train"] = [{"step": int(r["step"]), **{k.split("/")[1]: r[k] for k in TRAIN_KEYS if k in r}}
                    for r in metrics if r.get("kind") == "train"]
    return run | {"arm": arm_name(variant, tools), "tools": tools}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.steps, args.eval_interval = 2, 2
    t0, load_start = time.perf_counter(), records.load_avg()
    runs = [one_run(v, tools, seed, args) for seed in parse_seeds(args.seeds) for v, tools in ARMS]
    record = {"config": {"preset": PRESET, "steps": args.steps, "seeds": parse_seeds(args.seeds),
                         "eval_interval": args.eval_interval, "smoke": args.smoke,
                         "arms": [arm_name(v, t) for v, t in ARMS]},
              "load_avg_start": load_start, "load_avg_end": records.load_avg(),
              "wall_s_total": round(time.perf_counter() - t0, 1), "runs": runs}
    path = records.write_record("tool_use", record, Path(args.out) if args.out else None)
    plot(path.with_suffix(".png"), runs)
    print(f"wrote {path}")
    return 0


def plot(path: Path, runs: list[dict]) -> None:
    """Held-out greedy accuracy, the greedy episodes' tool calls per problem, and rollout/tool_use per step."""
    from bench.lib.plots import pyplot, save
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = dict(zip((arm_name(v, t) for v, t in ARMS), plt.cm.tab10.colors))
    for r in runs:
        style = {"color": colors[r["arm"]], "marker": "o", "ms": 3, "label": f"{r['arm']} (seed {r['seed']})"}
        axes[0].plot([p["step"] for p in r["curve"]], [p["greedy"] for p in r["curve"]], **style)
        pts = [p for p in r["curve"] if p["greedy_tool_calls"] is not None]
        axes[1].plot([p["step"] for p in pts], [p["greedy_tool_calls"] for p in pts], **style)
        pts = [p for p in r["train"] if "tool_use" in p]
        axes[2].plot([p["step"] for p in pts], [p["tool_use"] for p in pts], **style)
    for ax, ylabel in zip(axes, ("held-out greedy accuracy", "held-out calls per problem (greedy)",
                                 "rollout/tool_use (episodes with a call)")):
        ax.set_xlabel("policy steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("builtin:crates: RL with and without the calculator (MCP, stdio)", fontsize=10)
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
