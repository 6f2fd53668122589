"""VAPO on a real pretrained model on this CPU: `vapo-mcp train --preset smollm-word` end to end (docs/training.md "Train a real model").

1. The run, as a user starts it: `vapo-mcp train --preset smollm-word [--set …]` (SmolLM2-135M-Instruct on
   builtin:word, LoRA, a 6-layer critic cut from the policy's trunk), its printed lines kept (the README's
   transcript), its held-out curve read from the run's metrics: greedy and sampled accuracy overall and per
   bucket, and the critic's held-out explained variance at every evaluation.
2. The seed's smoke question against the base model and against the run's final checkpoint, each served by
   `vapo-mcp serve-model` on a loopback port: `vapo-mcp smoke --json` asked `--smoke-samples` times of each
   (temperature 0.2, as smoke asks), the pass rate and every answer's tail recorded.

Timings on 2 shared cores depend on the load: run it alone (`cpu-slot --both`, OMP_NUM_THREADS=2) and the record
keeps the load average before and after. Not a test: nothing here asserts.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.experiments.smollm_word_run [--set training.total_steps=60] [--seed 7 --name smollm_word_run_seed7]
        [--smoke-samples 20] [--out DIR]
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

from bench.lib.records import REPO, load_avg, write_record
from bench.lib.runs import eval_curve, train_stats

CLI = [sys.executable, "-m", "server.cli"]
SHOWN = ("eval   step", "value-pretrain", "train  step", "succeeded:", "failed:", "  eval/", "prompts:", "LoRA:")
BUCKETS = ("speed", "price", "rate", "percent", "two_step")
PROMPT = "A train covers 240 km in 3 hours. What is its average speed in km/h?"
SMOKE_TOKENS = 128
"""max_tokens of each smoke call (smoke's default is 256; the base model rambles on to the limit)."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides for the run")
    p.add_argument("--smoke-samples", type=int, default=20, help="smoke questions asked of each model")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: settings.json's experiment.seed)")
    p.add_argument("--name", default="smollm_word_run", help="record name (a second seed: smollm_word_run_seed7)")
    return p.parse_args(argv)


def train(overrides: list[str], settings: Path | None = None) -> tuple[list[str], Path, float, int]:
    """`vapo-mcp train --preset smollm-word`: (printed lines, run dir, wall seconds, exit code)."""
    argv = [*CLI, "train", "--preset", "smollm-word", *(a for o in overrides for a in ("--set", o)),
            *(["--settings", str(settings)] if settings else [])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True, bufsize=1)
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    code = proc.wait()
    run_dir = next(Path(ln.split(": ", 1)[1]) for ln in lines if ln.startswith("run ") and ": " in ln)
    return lines, run_dir, time.perf_counter() - t0, code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seeded(seed: int, tmp: Path) -> Path:
    """settings.json with experiment.seed = `seed`, written into `tmp` (its log_dir made absolute: relative ones
    are taken from the settings file's folder, so the run stays under the repository's)."""
    data = json.loads((REPO / "settings.json").read_text(encoding="utf-8"))
    data.setdefault("experiment", {})["seed"] = seed
    runtime = data.setdefault("runtime", {})
    runtime["log_dir"] = str((REPO / runtime.get("log_dir", "./logs/vapo")).resolve())
    (tmp / "settings.json").write_text(json.dumps(data), encoding="utf-8")
    return tmp / "settings.json"


def smoke_rate(target: str, samples: int, tmp: Path) -> dict:
    """Serve `target` with `vapo-mcp serve-model` and ask the smoke question `samples` times."""
    import httpx
    port, key = _free_port(), "sk-bench-smoke-0000000000000000"
    server = subprocess.Popen([*CLI, "serve-model", target, "--port", str(port), "--model-name", "policy"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    settings, config = tmp / "settings.json", tmp / "config.toml"
    settings.write_text(json.dumps({"api": {"base_url": url}, "models": {"reasoning": "policy", "fallback": "policy"},
                                    "runtime": {"stream": True, "log_dir": str(tmp / "logs")}}))
    config.write_text("[api]\ntimeout_seconds = 300\nmax_retries = 1\n")
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()} | {"TAOTOKEN_API_KEY": key}
    env.pop("TAOTOKEN_BASE_URL", None)
    try:
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(url.removesuffix("/v1") + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit(f"serve-model {target} did not start")
            time.sleep(1)
        answers = []
        for _ in range(samples):
            out = subprocess.run([*CLI, "smoke", "--settings", str(settings), "--config", str(config), "--json",
                                  "--max-tokens", str(SMOKE_TOKENS)],
                                 cwd=REPO, env=env, capture_output=True, text=True, check=False)
            res = json.loads(out.stdout)
            answers.append({"passed": res["passed"], "reason": res["reason"][:160],
                            "answer_tail": res["answer_excerpt"][-200:], "finish_reason": res.get("finish_reason")})
    finally:
        server.terminate()
        server.wait(30)
    passed = sum(a["passed"] for a in answers)
    return {"target": target, "samples": samples, "passed": passed, "rate": round(passed / samples, 3),
            "answers": answers}


def summary(records: list[dict]) -> dict:
    evals = [r for r in records if r.get("kind") == "eval"]
    curve = eval_curve(records)
    for point, r in zip(curve, sorted(evals, key=lambda r: r["step"])):
        point.update({f"sampled_{b}": r.get(f"eval/sampled_accuracy_{b}") for b in BUCKETS})
        point.update({f"greedy_{b}": r.get(f"eval/greedy_accuracy_{b}") for b in BUCKETS})
        point.update({"critic_ev": r.get("eval/critic_ev"), "critic_ev_start": r.get("eval/critic_ev_start"),
                      "response_length": r.get("eval/response_length")})
    first, last = curve[0], curve[-1]
    return {"curve": curve, "start_sampled": first["sampled"], "final_sampled": last["sampled"],
            "gain_sampled_points": round(100 * (last["sampled"] - first["sampled"]), 1),
            "start_greedy": first["greedy"], "final_greedy": last["greedy"],
            "gain_greedy_points": round(100 * (last["greedy"] - first["greedy"]), 1), **train_stats(records)}


def main(argv=None) -> int:
    args = parse_args(argv)
    from vapo_engine.rundir import RunDir
    start, t_start = load_avg(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vapo-bench-seed-") as tmp:
        lines, run_dir, wall, code = train(args.set, None if args.seed is None else _seeded(args.seed, Path(tmp)))
    end_train = load_avg()
    if code != 0:
        raise SystemExit(f"the run failed (exit {code}); see {run_dir}/worker.log")
    rd = RunDir(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="vapo-bench-smoke-") as tmp:
        base = smoke_rate("builtin:smollm2-135m-instruct", args.smoke_samples, Path(tmp))
        trained = smoke_rate(str(run_dir), args.smoke_samples, Path(tmp))
    rec = {"preset": "smollm-word", "overrides": args.set, "seed": json.loads((run_dir / "run.json").read_text())
           .get("seed"), "run_dir": os.path.relpath(run_dir, REPO), "wall_s": round(wall, 1),
           "wall_s_total": round(time.perf_counter() - t_start, 1),
           "run_summary": {k: v for k, v in rd.summary().items() if k in ("status", "steps", "seconds")},
           "printed": [ln for ln in lines if ln.startswith(SHOWN)], **summary(rd.metrics()),
           "smoke": {"prompt": PROMPT, "expect": "80", "max_tokens": SMOKE_TOKENS, "base": base, "trained": trained},
           "config": {k: config[k] for k in ("model", "lora", "critic", "vapo", "training", "eval") if k in config},
           "load_avg_start": start, "load_avg_after_training": end_train, "load_avg_end": load_avg()}
    path = write_record(args.name, rec, REPO / args.out if args.out else None)
    print(f"{path}: sampled {rec['start_sampled']:.3f} -> {rec['final_sampled']:.3f} "
          f"({rec['gain_sampled_points']:+.1f} points) in {wall:.0f} s; smoke base {base['rate']:.2f}, "
          f"trained {trained['rate']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
