"""Rollout backends on this CPU: the trainer sampling with Hugging Face `generate` in its own process (`hf`) vs
`serve-model` replicas on loopback speaking the rollout protocol (`server`, 1 and 2 replicas).

Scenarios, each an ordinary cpu-demo run (config.toml + cpu-demo, no value pretraining, no evaluation or
checkpoint before the end) of `--warmup` + `--steps` rollout steps of 128 responses (4 updates each), trained in
this process with seed 1:
  hf         rollout.backend = "hf" (the default)
  server-1   rollout.backend = "server", one `vapo-mcp serve-model` process of the built-in model
  server-2   the same with two processes; the prompts are spread over them
The trainer runs `--threads` torch threads (default: torch's, one per core) and each replica process
threads // replicas (at least 1; two replicas with a thread per core each would fight over the cores); a replica
is started, and answers /health, before its scenario's clock starts, and is stopped after. On a loaded machine
use `--threads 1`: OpenMP threads that wait at barriers for a descheduled sibling make multi-threaded generation
of a tiny model tens of times slower there.
The scenarios run in turn, `--repeats` rounds, so slow drift of the machine's load hits them alike. Reported per
scenario and round: generated tokens/s of the rollout (rollout/tokens_per_s: response tokens over the wall time
of generation, the HTTP round trips included for `server`), seconds per rollout step (wall time between two
steps' records: sampling, scoring, updates and, for `server`, writing the weights and every replica loading
them), with the load average around each run. Not a test: nothing here asserts.

On CPU `server` is a protocol test double: the replicas run the same Hugging Face model on the same cores as the
trainer, so this measures the protocol's overhead (HTTP, JSON, the weight push), not an engine's speed-up; the
speed-up of paged attention and continuous batching is a GPU-engine property (scripts/gpu_check.py --checks engine).

    .venv/bin/python -m bench.perf.rollout_backends [--steps 3] [--warmup 1] [--repeats 2] [--threads N] [--smoke]
        [--out DIR]
"""
from __future__ import annotations

import argparse
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import plots
from bench.lib.records import REPO, load_avg, write_record
from bench.lib.runs import PRESET, SMOKE_OVERRIDES, load_bench_config, settings_with_seed

SCENARIOS = (("hf", 0), ("server-1", 1), ("server-2", 2))
UPDATES_PER_ROLLOUT = 4  # cpu-demo: batch 128, mini-batches of 32 (the smoke: 1)


def replica_threads(threads: int, count: int) -> int:
    return max(1, threads // count)


def start_replicas(model: Path, root: Path, count: int, threads: int) -> tuple[list[subprocess.Popen], list[str]]:
    """`count` serve-model processes of `model` on free loopback ports, each with threads // count torch threads,
    that may load weights from under `root`; returns once every one answers /health."""
    from vapo_engine.rollout.backends.replicas import wait_until_healthy
    threads = str(replica_threads(threads, count))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, HF_HUB_OFFLINE="1")
    procs, urls = [], []
    for _ in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cli = str(Path(sys.executable).with_name("vapo-mcp"))
        procs.append(subprocess.Popen([cli, "serve-model", str(model), "--port", str(port), "--weight-root",
                                       str(root), "--log-level", "warning"], cwd=REPO, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        urls.append(f"http://127.0.0.1:{port}")
    for p, url in zip(procs, urls):
        why = wait_until_healthy(p, url, timeout_s=300)
        if why is not None:
            tail = p.stderr.read()[-1500:] if p.poll() is not None else ""  # it exited: say what it printed
            stop(procs)
            raise SystemExit(f"serve-model {url}: {why} {tail}".rstrip())
    return procs, urls


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def one_run(name: str, replicas: int, rollouts: int, smoke: bool, model: Path, threads: int,
            shared: tuple[Path, list[str]] | None = None) -> dict:
    """Train one scenario for `rollouts` rollout steps; its per-step numbers (first `warmup` left to the caller).
    `shared`: (weight root, urls) of replicas already running, of which the scenario uses the first `replicas`
    (the trainer pushes its weights to them first); otherwise it starts its own and stops them after."""
    from vapo_engine.rundir import RunDir
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    per = 1 if smoke else UPDATES_PER_ROLLOUT
    extra = [f"training.total_steps={rollouts * per}", "eval.eval_interval=100000",
             "eval.save_interval=100000", "eval.num_problems=8", "eval.samples_per_problem=1",
             *(SMOKE_OVERRIDES if smoke else ()), "vapo.value_pretrain_steps=0"]  # after the smoke's 1
    with tempfile.TemporaryDirectory(prefix="vapo-rb-", dir=shared[0] if shared else None) as tmp:
        if shared:
            procs, urls = [], shared[1][:replicas]
        else:
            procs, urls = start_replicas(model, Path(tmp), replicas, threads) if replicas else ([], [])
        try:
            if urls:
                listed = ", ".join(f'"{u}"' for u in urls)
                extra += ['rollout.backend="server"', f"rollout.urls=[{listed}]"]
            config, overrides = load_bench_config("vapo", extra)
            run = create_run(config, settings_with_seed(1), Path(tmp), run_id=name, overrides=overrides,
                             preset=PRESET).run_dir
            load0, t0 = load_avg(), time.perf_counter()
            summary = train(run, log=lambda m: None)
            wall = time.perf_counter() - t0
            recs = [r for r in RunDir(run).metrics() if r.get("kind") == "train"]
        finally:
            stop(procs)
    if summary.get("status") != "succeeded" or len(recs) != rollouts:
        raise SystemExit(f"{name}: run {summary.get('status')} after {len(recs)} of {rollouts} rollout steps")
    times = [r["time"] for r in recs]
    return {"tokens_per_s": [r["rollout/tokens_per_s"] for r in recs],
            "s_per_step": [round(b - a, 3) for a, b in itertools.pairwise(times)],
            "rollout_time_s": [r["perf/rollout_time_s"] for r in recs],
            "update_time_s": [r["perf/update_time_s"] for r in recs],
            "response_length": [r["rollout/response_length"] for r in recs],
            "wall_s": round(wall, 1), "load_avg_start": load0, "load_avg_end": load_avg()}


def mean(xs: list) -> float:
    return round(statistics.fmean(xs), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="measured rollout steps per run (cpu-demo shapes)")
    ap.add_argument("--warmup", type=int, default=1, help="rollout steps not measured at the start of each run")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the scenarios (interleaved)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the trainer (default: torch's); "
                    "each replica gets threads // replicas")
    ap.add_argument("--smoke", action="store_true", help="seconds: tiny batch, one round, the replicas started once "
                    "and shared by the server scenarios (tests)")
    ap.add_argument("--out", help="folder for the JSON record and plot (default bench/results)")
    args = ap.parse_args()
    import torch
    if args.threads:
        torch.set_num_threads(max(1, args.threads))
    threads = torch.get_num_threads()
    from vapo_engine.builtin_model import builtin_model_dir
    model = Path(builtin_model_dir(log=lambda m: print(m, flush=True)))
    steps, warmup = (1, 1) if args.smoke else (max(1, args.steps), max(1, args.warmup))
    repeats = 1 if args.smoke else max(1, args.repeats)
    t0, load0 = time.perf_counter(), load_avg()
    rounds = []
    # --smoke starts the most replicas any scenario uses once and lends them to every server scenario: a replica
    # process costs seconds of CPU before it answers, and the smoke only checks that the benchmark runs
    most = max(count for _, count in SCENARIOS)
    with tempfile.TemporaryDirectory(prefix="vapo-rb-") as root:
        procs, urls = start_replicas(model, Path(root), most, threads) if args.smoke else ([], [])
        try:
            for i in range(repeats):
                rounds.append({})
                for name, count in SCENARIOS:
                    got = rounds[-1][name] = one_run(name, count, warmup + steps, args.smoke, model, threads,
                                                     (Path(root), urls) if args.smoke else None)
                    print(f"round {i + 1} {name:9} {mean(got['tokens_per_s'][warmup:]):8.0f} tok/s  "
                          f"{mean(got['s_per_step'][warmup - 1:]):6.2f} s/step  load {got['load_avg_start']} -> "
                          f"{got['load_avg_end']}", flush=True)
        finally:
            stop(procs)
    rows = []
    for name, count in SCENARIOS:
        runs = [rnd[name] for rnd in rounds]
        tok = [mean(r["tokens_per_s"][warmup:]) for r in runs]
        sps = [mean(r["s_per_step"][warmup - 1:]) for r in runs]
        rows.append({"scenario": name, "replicas": count, "tokens_per_s": mean(tok), "tokens_per_s_rounds": tok,
                     "s_per_step": mean(sps), "s_per_step_rounds": sps,
                     "rollout_time_s": mean([x for r in runs for x in r["rollout_time_s"][warmup:]]),
                     "update_time_s": mean([x for r in runs for x in r["update_time_s"][warmup:]]),
                     "response_length": mean([x for r in runs for x in r["response_length"][warmup:]]),
                     "load_avg_rounds": [[r["load_avg_start"], r["load_avg_end"]] for r in runs], "runs": runs})
    hf = rows[0]
    for r in rows:
        r["s_per_step_vs_hf"] = round(r["s_per_step"] / hf["s_per_step"], 2)
        r["tokens_per_s_vs_hf"] = round(r["tokens_per_s"] / hf["tokens_per_s"], 2)
    config = {"preset": PRESET, "steps": steps, "warmup": warmup, "repeats": repeats, "smoke": args.smoke,
              "seed": 1, "updates_per_rollout": 1 if args.smoke else UPDATES_PER_ROLLOUT,
              "trainer_threads": threads,
              "replicas_shared": args.smoke,
              "replica_threads": {r["scenario"]: replica_threads(threads, most if args.smoke else r["replicas"])
                                  for r in rows if r["replicas"]}}
    path = write_record("rollout_backends", {"config": config, "rows": rows, "wall_s_total":
                                             round(time.perf_counter() - t0, 1), "load_avg_start": load0,
                                             "load_avg_end": load_avg()}, Path(args.out) if args.out else None)
    _plot(rows, path.with_suffix(".png"))
    print(f"record: {path}")


def _plot(rows: list[dict], path: Path) -> None:
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    names, colors = [r["scenario"] for r in rows], ["#4c72b0", "#dd8452", "#55a868"]
    for ax, key, label in ((axes[0], "tokens_per_s", "generated tokens / s"), (axes[1], "s_per_step",
                                                                               "s / rollout step")):
        ax.bar(names, [r[key] for r in rows], color=colors[:len(rows)], alpha=0.8)
        for i, r in enumerate(rows):  # every round's value on its bar
            ax.plot([i] * len(r[f"{key}_rounds"]), r[f"{key}_rounds"], "k.", ms=6)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("cpu-demo rollouts: hf generate in the trainer vs serve-model replicas on loopback (same CPU)",
                 fontsize=9)
    plots.save(fig, path)


if __name__ == "__main__":
    main()
