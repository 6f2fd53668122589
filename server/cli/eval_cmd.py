"""`vapo-mcp eval`: a model's held-out accuracy, measured like a run's evaluation (tools/evaluate.py).

    vapo-mcp eval --run RUN_ID [--step N]        the run's checkpoint, locally, with the run's eval settings
    vapo-mcp eval --model-dir DIR                any HF model directory, locally, with config.toml's settings
    vapo-mcp eval --channel [--model ID]         the API channel (a provider, or a served checkpoint)
    vapo-mcp eval --channel --run RUN_ID         the API model on exactly the run's evaluation

Exit codes: 0 = an accuracy was measured, 1 = it could not be (every request failed, the provider refused),
2 = user error (bad arguments or files), printed without a traceback.
"""
from __future__ import annotations

import sys

from tools.paths import files

from .common import UserError, add_file_options, add_json_option, positive_int, print_json


def register(sub) -> None:
    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint (local) or an API model (--channel)")
    add_file_options(p)
    add_json_option(p)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--run", metavar="RUN_ID", help="a run: evaluated with its own frozen eval settings; without --channel, on its checkpoint")
    who.add_argument("--model-dir", metavar="DIR", help="a Hugging Face model directory, run locally with config.toml's settings")
    p.add_argument("--step", type=positive_int(10**9, 0), help="with --run, local only: the checkpoint saved at this step (default: the newest complete one)")
    p.add_argument("--channel", action="store_true",
                   help="ask the API channel of settings.json instead of running a local model")
    p.add_argument("--model", help="with --channel: the model id to ask (default: models.reasoning, falling back to models.fallback)")
    p.add_argument("--benchmark", help="builtin:<task>, a JSONL name (<data_dir>/<name>.jsonl) or a .jsonl path "
                                       "(default: eval.benchmark)")
    p.add_argument("--num-problems", type=positive_int(100_000),
                   help="how many held-out problems to ask (default: eval.num_problems of the run's or config.toml's config)")
    p.add_argument("--samples", type=positive_int(1024, 0), help="sampled answers per problem, the k of avg@k, at the config's temperature "
                                                              "(default: eval.samples_per_problem; 0 = greedy only)")
    p.add_argument("--max-tokens", type=positive_int(1_000_000),
                   help="most new tokens per answer (default: model.max_tokens; without --run, a built-in "
                        "task caps it at its answers' length)")
    p.add_argument("--preset", help="without --run: a preset applied to config.toml before its settings are read (e.g. "
                                       "cpu-demo)")
    p.add_argument("--concurrency", type=positive_int(64), default=8, help="with --channel: requests in flight at once (default 8)")
    p.add_argument("--timeout", type=positive_int(86_400), default=3600, help="seconds the whole evaluation may take (default 3600): a local one "
                   "is then stopped and fails; with --channel, requests still open count as failures")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="local models only: where the model runs (auto = cuda when available, else cpu)")
    p.set_defaults(func=eval_cmd)


def eval_cmd(args) -> int:
    from tools.evaluate import evaluate_sync

    if not args.channel and not (args.run or args.model_dir):
        raise UserError("pass --run RUN_ID or --model-dir DIR to evaluate a local model, or --channel to evaluate "
                        "the API model")
    if args.preset and args.run:
        raise UserError("--preset applies without --run (a run evaluates with its own frozen settings)")

    def progress(fraction: float, message: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\r[{fraction:4.0%}] {message[:60]:60}", end="", file=sys.stderr, flush=True)

    report = evaluate_sync(
        files(args.config, args.settings), backend="channel" if args.channel else "local", run_id=args.run,
        step=args.step, model_dir=args.model_dir, model=args.model, benchmark=args.benchmark,
        num_problems=args.num_problems, samples_per_problem=args.samples, max_tokens=args.max_tokens,
        preset=args.preset, concurrency=args.concurrency, timeout_s=args.timeout, device=args.device,
        on_progress=progress)
    if not args.json and sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print_json(report.model_dump(mode="json"))
    else:
        print_report(report)
    return 0 if report.ok else 1


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def print_report(r) -> None:
    where = f"run {r.run_id}" + (f" step {r.step}" if r.step is not None else "") if r.run_id else ""
    print(f"benchmark  {r.benchmark}: {r.problems} held-out problems, avg@{r.samples_per_problem}, "
          f"max_tokens {r.max_tokens}, temperature {r.temperature:g}, top_p {r.top_p:g}  ({r.settings_from})")
    used = ", ".join(f"{m} ×{n}" for m, n in r.models_used.items()) if len(r.models_used) > 1 else ""
    print(f"model      {r.model}  [{r.backend}] {where} {used}".rstrip())
    print(f"\n{'':10}{'greedy':>9}{'avg@' + str(r.samples_per_problem):>9}")
    print(f"{'all':10}{_pct(r.greedy_accuracy):>9}{_pct(r.sampled_accuracy):>9}")
    for bucket, accs in r.buckets.items():
        print(f"{bucket:10}{_pct(accs.get('greedy')):>9}{_pct(accs.get('sampled')):>9}")
    print()
    if r.response_length is not None:
        print(f"length     {r.response_length:.1f} tokens (greedy answers, mean)")
    if r.latency_ms:
        print(f"latency    p50 {r.latency_ms['p50']:.0f} ms, p95 {r.latency_ms['p95']:.0f} ms over {r.requests} "
              "requests")
    if r.tokens:
        print("tokens     " + ", ".join(f"{k} {v}" for k, v in r.tokens.items()))
    if r.failures.count:
        kinds = ", ".join(f"{k} {n}" for k, n in r.failures.kinds.items())
        print(f"failures   {r.failures.count} ({kinds})")
        for msg in r.failures.first:
            print(f"  - {msg}")
    print(f"time       {r.seconds:.1f} s")
    print(f"\n{'OK' if r.ok else 'FAILED'}: {r.summary}")
