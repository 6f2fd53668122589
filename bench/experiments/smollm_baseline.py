"""What SmolLM2-135M-Instruct gets right on builtin:word before any RL: held-out accuracy per bucket (docs/results.md "A real pretrained model before RL").

The measurement is the product's own: `vapo-mcp eval --model-dir builtin:smollm2-135m-instruct --preset
smollm-word` (tools.evaluate: the run's held-out problems, its chat-template prompts, its checker, greedy and
sampled avg@k at the preset's temperature and max_tokens), on `--problems` held-out problems (the five kinds in
turn) with `--samples` samples each. The record keeps the per-bucket accuracies, a few answers of each kind (what
the model writes), and the time taken. The preset's task mix was chosen from this record: the issue asks that
RL start between 10 % and 40 % sampled accuracy.

    .venv/bin/python -m bench.experiments.smollm_baseline [--problems 100] [--samples 4] [--out DIR]
"""
from __future__ import annotations

import argparse
import time

from bench.lib import records

MODEL = "builtin:smollm2-135m-instruct"
PRESET = "smollm-word"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--problems", type=int, default=100, help="held-out problems (the kinds in turn)")
    p.add_argument("--samples", type=int, default=4, help="sampled answers per problem (avg@k)")
    p.add_argument("--benchmark", default="builtin:word")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def examples(benchmark: str, per_bucket: int = 2, max_tokens: int = 96) -> list[dict]:
    """Greedy answers of the base model to the first held-out problems of each bucket (what it writes)."""
    import torch

    from vapo_engine.config.train_model import ModelConfig
    from vapo_engine.prompts import resolve_prompt_format
    from vapo_engine.rollout.generate import generate
    from vapo_engine.serving.model import load_served_model
    from vapo_engine.tasks import get_task
    task = get_task(benchmark)
    served = load_served_model(MODEL, "base", device="cpu", dtype="float32")
    fmt = resolve_prompt_format(ModelConfig(prompt_format="chat"), served.tokenizer, task)
    chosen, seen = [], {}
    for p in task.heldout(10 * per_bucket):
        b = task.bucket(p)
        if seen.get(b, 0) < per_bucket:
            seen[b] = seen.get(b, 0) + 1
            chosen.append(p)
    with torch.no_grad():
        gen = generate(served.model, served.tokenizer, [p.prompt for p in chosen], max_new_tokens=max_tokens,
                       do_sample=False, prompt_format=fmt)
    return [{"bucket": task.bucket(p), "prompt": p.prompt, "answer": p.answer, "response": t,
             "correct": bool(task.reward(t, p.answer))} for p, t in zip(chosen, gen.texts)]


def main(argv=None) -> int:
    args = parse_args(argv)
    from tools.evaluate import evaluate_sync
    from tools.paths import files
    load_start, t0 = records.load_avg(), time.time()
    f = files(str(records.REPO / "config.toml"), str(records.REPO / "settings.json"))
    report = evaluate_sync(f, backend="local", model_dir=MODEL, benchmark=args.benchmark, preset=PRESET,
                           num_problems=args.problems, samples_per_problem=args.samples, device="cpu",
                           timeout_s=6 * 3600)
    if not report.ok:
        raise SystemExit(f"evaluation failed: {report.summary}")
    shown = examples(args.benchmark, max_tokens=report.max_tokens)
    rec = {"model": MODEL, "preset": PRESET, "benchmark": args.benchmark, "problems": report.problems,
           "samples_per_problem": report.samples_per_problem, "max_tokens": report.max_tokens,
           "temperature": report.temperature, "top_p": report.top_p, "greedy_accuracy": report.greedy_accuracy,
           "sampled_accuracy": report.sampled_accuracy, "buckets": report.buckets,
           "response_length": report.response_length, "eval_seconds": round(report.seconds, 1),
           "examples": shown, "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load_start,
           "load_avg_end": records.load_avg()}
    path = records.write_record("smollm_word_baseline", rec, records.REPO / args.out if args.out else None)
    print(f"{path}: greedy {report.greedy_accuracy:.3f}, sampled {report.sampled_accuracy:.3f}, "
          f"buckets {report.buckets}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
