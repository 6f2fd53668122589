"""Two training runs at once on the same cores: torch's default threads vs the run manager's thread budget.

Scenarios, each an ordinary cpu-demo worker process (`python -m vapo_engine.trainer RUN_DIR`) on the built-in
tiny model:
  alone          one run with the worker environment the run manager gives it (`jobs.threads.worker_env`)
  alone-active   the same with OMP_WAIT_POLICY=ACTIVE (OpenMP threads spin while they wait)
  alone-passive  the same with OMP_WAIT_POLICY=PASSIVE (waiting threads yield; what every run got before)
  alone-1-thread one run on one thread: each two-sized run's share of the cores, so the floor of two-sized (two
                 runs at once cannot each be faster than one run alone on half the cores)
  two-naive      two runs at once, each with torch's defaults (a thread per core, OpenMP's spinning wait)
  two-sized      two runs at once with `worker_env(concurrent=2)`: cores // 2 threads each, passive waiting
The scenarios run in turn, `--repeats` rounds, so slow drift of the machine hits them alike. Reported per
scenario: the mean rollout-step time per run (perf/step_time_s, first rollout step excluded) of each round,
their mean, wall time, and the ratios to `alone`, measured in one invocation. Not a test: nothing here asserts.

    .venv/bin/python -m bench.perf.concurrency [--steps 30] [--repeats 2] [--smoke] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import plots
from bench.lib.records import REPO, load_avg, write_record
from bench.lib.runs import PRESET, SMOKE_OVERRIDES, load_bench_config, settings_with_seed

NAIVE_STRIP = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")


SCENARIOS = ("alone", "alone-active", "alone-passive", "alone-1-thread", "two-naive", "two-sized")
SMOKE_SCENARIOS = ("alone", "two-sized")
"""--smoke runs one worker alone (the baseline of every ratio) and two at once with the run manager's budget: a
worker process costs seconds of CPU before its first step, and the smoke only checks that the benchmark runs and
writes its record. It leaves out the two spinning scenarios (forced ACTIVE, naive), which take minutes on 2
cores even at smoke size, and alone-passive (alone with OMP_WAIT_POLICY=PASSIVE set)."""
WAIT = {"alone-active": "ACTIVE", "alone-passive": "PASSIVE"}


def _env(scenario: str, smoke: bool = False) -> dict:
    from vapo_engine.jobs.threads import THREAD_VARS, worker_env
    # --smoke keeps the caller's thread count (the tests run every process on one thread): it only checks that the
    # benchmark runs and writes its record, and two spinning threads on busy cores make it take minutes
    keep = THREAD_VARS if smoke else ()
    base = {k: v for k, v in os.environ.items() if k not in NAIVE_STRIP or k in keep}
    if scenario == "two-naive":
        return dict(base, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    if scenario in WAIT:
        base["OMP_WAIT_POLICY"] = WAIT[scenario]
    if scenario == "alone-1-thread":
        base.update({var: "1" for var in THREAD_VARS})
    return worker_env(concurrent=2 if scenario == "two-sized" else 1, base=dict(base, PYTHONPATH=str(REPO)))


def _make_runs(tmp: Path, n: int, steps: int, smoke: bool) -> list[Path]:
    from vapo_engine.runs import create_run
    extra = [f"training.total_steps={steps}", "eval.eval_interval=100000", "eval.save_interval=100000",
             "vapo.value_pretrain_steps=1", "eval.num_problems=16", "eval.samples_per_problem=1",
             *((*SMOKE_OVERRIDES, "eval.num_problems=2") if smoke else ())]  # smoke: evaluations are not timed
    config, overrides = load_bench_config("vapo", extra)
    return [create_run(config, settings_with_seed(i + 1), tmp, run_id=f"r{i}", overrides=overrides,
                       preset=PRESET).run_dir for i in range(n)]


def _step_times(run_dir: Path) -> list[float]:
    from vapo_engine.rundir import RunDir
    return [float(r["perf/step_time_s"]) for r in RunDir(run_dir).metrics()
            if r.get("kind") == "train" and "perf/step_time_s" in r]


def scenario(name: str, steps: int, smoke: bool) -> dict:
    n = 2 if name.startswith("two-") else 1  # the alone-* rows are one run (they compare wait policies)
    with tempfile.TemporaryDirectory(prefix="vapo-conc-") as tmp:
        runs = _make_runs(Path(tmp), n, steps, smoke)
        env, t0, load0 = _env(name, smoke), time.perf_counter(), load_avg()
        procs = [subprocess.Popen([sys.executable, "-m", "vapo_engine.trainer", str(r)], env=env, cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in runs]
        errs = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t0
        bad = [e[-800:] for p, e in zip(procs, errs) if p.returncode != 0]
        if bad:
            raise SystemExit(f"{name}: a worker failed:\n{bad[0]}")
        times = [_step_times(r)[1:] or _step_times(r) for r in runs]
    per_run = [round(statistics.fmean(t), 4) for t in times]
    return {"scenario": name, "runs": n, "threads": env.get("OMP_NUM_THREADS", "torch default"),
            "wait_policy": env.get("OMP_WAIT_POLICY", "default"), "step_time_s_per_run": per_run,
            "mean_step_time_s": round(statistics.fmean(per_run), 4), "wall_s": round(wall, 1),
            "load_avg_start": load0, "load_avg_end": load_avg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="policy steps per run (cpu-demo shapes)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the scenarios (interleaved)")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 2 steps, tiny batch, one round (tests)")
    ap.add_argument("--out", help="folder for the JSON record (default bench/results)")
    args = ap.parse_args()
    from vapo_engine.builtin_model import builtin_model_dir
    builtin_model_dir(log=lambda m: print(m, flush=True))  # build/cache outside the timed part
    steps = 2 if args.smoke else args.steps
    repeats = 1 if args.smoke else max(1, args.repeats)
    names = SMOKE_SCENARIOS if args.smoke else SCENARIOS
    rounds = [[scenario(s, steps, args.smoke) for s in names] for _ in range(repeats)]
    rows = [_pool([rnd[i] for rnd in rounds]) for i in range(len(names))]
    by = {r["scenario"]: r["mean_step_time_s"] for r in rows}
    alone = by["alone"]
    for r in rows:
        r["step_time_vs_alone"] = round(r["mean_step_time_s"] / alone, 2)
        print(f"{r['scenario']:13} threads {r['threads']:>13}  wait {r['wait_policy']:8}  step "
              f"{r['mean_step_time_s']:.3f}s {r['round_means']} ({r['step_time_vs_alone']:.2f}x alone)  "
              f"wall {r['wall_s']:.0f}s  load {r['load_avg_start']} -> {r['load_avg_end']}", flush=True)
    ratio = (lambda a, b: round(by[a] / by[b], 2) if a in by and b in by else None)
    summary = {"naive_over_sized": ratio("two-naive", "two-sized"), "sized_over_alone": ratio("two-sized", "alone"),
               "alone_over_active": ratio("alone", "alone-active"),
               "passive_over_alone": ratio("alone-passive", "alone"),
               "one_thread_over_alone": ratio("alone-1-thread", "alone"),
               "sized_over_one_thread": ratio("two-sized", "alone-1-thread")}
    print("ratios: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    path = write_record("concurrency", {"steps": steps, "config": {"steps": steps, "smoke": args.smoke,
                                                                   "repeats": repeats},
                                        "rows": rows, **summary,
                                        "load_avg_start": rounds[0][0]["load_avg_start"],
                                        "load_avg_end": rounds[-1][-1]["load_avg_end"]},
                        Path(args.out) if args.out else None)
    _plot(rows, path.with_suffix(".png"))
    print(f"record: {path}")


def _pool(rounds: list[dict]) -> dict:
    """One scenario over the rounds: the mean of the round means, the first round's settings, total wall time."""
    means = [r["mean_step_time_s"] for r in rounds]
    return {**rounds[0], "round_means": means, "mean_step_time_s": round(statistics.fmean(means), 4),
            "step_time_s_per_run": [r["step_time_s_per_run"] for r in rounds],
            "wall_s": round(sum(r["wall_s"] for r in rounds), 1), "load_avg_end": rounds[-1]["load_avg_end"]}


def _plot(rows: list[dict], path: Path) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.4))
    labels = [f"{r['scenario']}\n{r['threads']} thr, {r['wait_policy']}" for r in rows]
    ax.bar(labels, [r["mean_step_time_s"] for r in rows], color=["#4c72b0", "#8172b2", "#937860", "#c44e52", "#55a868"])
    ax.set_ylabel("rollout-step time per run (s)")
    ax.set_title("cpu-demo runs alone (three wait policies) and two on the same cores", fontsize=10)
    plots.save(fig, path)


if __name__ == "__main__":
    main()
