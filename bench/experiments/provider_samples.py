"""Provider samples in training (docs/design.md §8, docs/results.md): does replaying a stronger model's correct answers speed RL up?

1. Train run A (cpu-demo preset, `--steps-a` policy steps) from the built-in addition model.
2. Serve A's newest checkpoint with `vapo-mcp serve-model` (a separate process on 127.0.0.1) and point a
   settings.json at it, exactly as a user points the channel at any OpenAI-compatible endpoint.
3. For each seed, train run B from the *initial* model twice, same seed and number of policy steps: without provider samples,
   and with `[provider_rollouts]` asking A's endpoint (correct answers join the positive replay buffer and
   enter only the positive-example NLL).
Reports, per arm: the first evaluated step and the wall time at which greedy held-out accuracy reaches the
start + `--gain` (default +15 points), the final accuracy, and the provider metrics (requests, answers,
provider accuracy, positives replayed, drops, latency). Writes bench/results/provider_samples.{json,png}.

Here the endpoint runs on the same two cores as the trainer, so the "with" arm's wall time also pays for
serving; with a remote API it would not. Never run it next to tests or other benchmarks.

    .venv/bin/python -m bench.experiments.provider_samples                      # ~25 min on 2 idle cores
    .venv/bin/python -m bench.experiments.provider_samples --smoke --out /tmp/x  # under a minute, for tests
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import plots, records
from bench.lib.runs import PRESET, SMOKE_OVERRIDES, parse_seeds, run_variant
from bench.lib.stats import spread

SETTINGS_ENV = "VAPO_MCP_SETTINGS"  # vapo_engine.jobs.threads.SETTINGS_ENV: the worker's channel
KEY_ENV = "VAPO_BENCH_PROVIDER_KEY"
"""The served endpoint on loopback needs no key; the channel still resolves one from this variable."""
MODEL_NAME = "policy-a"
PROVIDER_KEYS = ("requests", "ok", "failed", "rate_limited", "dropped", "sent", "accuracy", "positives_added",
                 "too_long", "latency_p50_s", "latency_p95_s", "completion_tokens", "concurrency_low")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps-a", type=int, default=300, help="policy steps of run A (the served model)")
    p.add_argument("--steps", type=int, default=200, help="policy steps of each run B")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds of the B runs")
    p.add_argument("--eval-interval", type=int, default=25, help="policy steps between evaluations of B")
    p.add_argument("--gain", type=float, default=0.15, help="target: start greedy accuracy + this")
    p.add_argument("--samples", type=int, default=2, help="provider answers per prompt")
    p.add_argument("--concurrency", type=int, default=8, help="provider requests in flight at most")
    p.add_argument("--smoke", action="store_true", help="tiny runs (seconds) to check the script works")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(run_dir: Path, port: int, log_path: Path) -> subprocess.Popen:
    """`vapo-mcp serve-model RUN_DIR` in its own process (one torch thread: the trainer keeps the other core)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "server.cli", "serve-model", str(run_dir), "--port", str(port),
           "--model-name", MODEL_NAME, "--log-level", "warning"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=records.REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    import httpx
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve-model exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("serve-model did not answer within 300 s")


def channel_settings(folder: Path, port: int) -> Path:
    s = json.loads((records.REPO / "settings.json").read_text())
    s["api"] = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": KEY_ENV, "default_headers": {}}
    s["models"] = {"reasoning": MODEL_NAME, "fallback": None}
    path = folder / "settings.json"
    path.write_text(json.dumps(s, indent=2))
    return path


def reach(curve: list[dict], gain: float) -> tuple[int | None, float | None, float]:
    """(first step, its wall seconds) at which greedy accuracy >= start + gain; and the target."""
    target = round(curve[0]["greedy"] + gain, 4)
    for p in curve:
        if p["greedy"] is not None and p["greedy"] >= target - 1e-9:
            return p["step"], p.get("time_s"), target
    return None, None, target


def row(r: dict, arm: str, gain: float) -> dict:
    step, wall, target = reach(r["curve"], gain)
    prov = {k: r["last_train"].get(f"provider/{k}") for k in PROVIDER_KEYS if f"provider/{k}" in r["last_train"]}
    return {"arm": arm, "seed": r["seed"], "start_greedy": r["curve"][0]["greedy"], "target": target,
            "steps_to_target": step, "wall_s_to_target": wall, "final_greedy": r["final_greedy"],
            "final_sampled": r["final_sampled"], "wall_s": r["wall_s"],
            "replay_provider": r["last_train"].get("vapo/replay_provider"), "provider": prov, "curve": r["curve"]}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for arm in ("without", "with"):
        mine = [r for r in rows if r["arm"] == arm]
        hit = [r["steps_to_target"] for r in mine]
        out[arm] = {"runs": len(mine), "reached": sum(h is not None for h in hit), "steps_to_target": hit,
                    "wall_s_to_target": [r["wall_s_to_target"] for r in mine],
                    "final_greedy": spread([r["final_greedy"] for r in mine]),
                    "final_sampled": spread([r["final_sampled"] for r in mine]),
                    "wall_s": spread([r["wall_s"] for r in mine])}
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    smoke = args.smoke
    steps_a, steps = (1, 2) if smoke else (args.steps_a, args.steps)  # smoke: A only needs a checkpoint to serve
    seeds = [1] if smoke else parse_seeds(args.seeds)
    every = 2 if smoke else args.eval_interval  # smoke: B evaluated at the start and the end
    extra = SMOKE_OVERRIDES if smoke else ()
    t0, load0 = time.time(), records.load_avg()
    meta = {"preset": PRESET, "steps_a": steps_a, "steps_b": steps, "seeds": seeds, "eval_interval": every,
            "gain": args.gain, "samples_per_prompt": args.samples, "concurrency": args.concurrency,
            "smoke": smoke, "extra_overrides": list(extra)}
    with tempfile.TemporaryDirectory(prefix="vapo-bench-provider-") as tmp:
        tmp = Path(tmp)
        a = run_variant("vapo", 1, steps_a, max(1, steps_a // 4), extra, keep_in=tmp / "a", name="run-a")
        print(f"run A: greedy {a['curve'][0]['greedy']:.3f} -> {a['final_greedy']:.3f} in {a['wall_s']:.0f} s",
              flush=True)
        port = free_port()
        server = serve(Path(a["run_dir"]), port, tmp / "serve.log")
        os.environ.setdefault(KEY_ENV, "unused-on-loopback")
        try:
            settings = channel_settings(tmp, port)
            os.environ[SETTINGS_ENV] = str(settings)  # as the run manager gives it to a worker
            provider = ("provider_rollouts.enabled=true", f"provider_rollouts.samples_per_prompt={args.samples}",
                        f"provider_rollouts.concurrency={args.concurrency}", "provider_rollouts.max_requests=100000")
            rows = []
            for seed in seeds:
                for arm, over in (("without", ()), ("with", provider)):
                    r = run_variant("vapo", seed, steps, every, (*extra, *over),
                                           name=f"b-{arm}-s{seed}")
                    rows.append(row(r, arm, args.gain))
                    x = rows[-1]
                    print(f"B {arm:>7} seed {seed}: {x['start_greedy']:.3f} -> {x['final_greedy']:.3f}, "
                          f"+{args.gain:.2f} at step {x['steps_to_target']} ({x['wall_s_to_target']} s), "
                          f"{x['wall_s']:.0f} s, provider {x['provider'] or '-'}", flush=True)
        finally:
            server.terminate()
            server.wait(30)
    record = {"config": meta, "run_a": {k: a[k] for k in ("curve", "final_greedy", "final_sampled", "wall_s")},
              "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load0, "load_avg_end": records.load_avg(),
              "summary": summarize(rows), "runs": rows}
    path = records.write_record("provider_samples", record, Path(args.out) if args.out else None)
    plots.plot_curves(path.with_suffix(".png"), {f"B {arm}": [r["curve"] for r in rows if r["arm"] == arm]
                                                  for arm in ("without", "with")},
                       f"run B with vs without provider samples from run A, seeds {seeds} (band = min-max)")
    print(json.dumps(record["summary"], indent=1))
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    return record


if __name__ == "__main__":
    main()
