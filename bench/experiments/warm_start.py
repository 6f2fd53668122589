"""What each built-in chain model starts RL from: held-out accuracy by difficulty, and where its answers go wrong.

For each named built-in model (vapo_engine/builtin_model/recipes.py; built into the cache on first use), on the
same held-out `builtin:chain` problems (an equal number per step count, 1-14):
- greedy accuracy and sampled accuracy (avg@k at temperature 1) per bucket (short 1-3, mid 4-8, long 9-14 steps);
- per sampled line: the rate at which a line copies its operation's sign wrong (the noisy teacher's deficit), and
  the rate at which a response stops before its chain is done (the planted-stop teacher's);
- the build's own record (phases, steps, seconds; the model folder's sft_metrics.json).

    .venv/bin/python -m bench.experiments.warm_start [--models builtin:chain,builtin:chain@planted-stop] [--problems 140]
                                         [--samples 4] [--smoke] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.lib import records


def line_errors(task, problem, text: str) -> tuple[int, int, bool]:
    """(lines written, lines whose sign differs from the prompt's operation, stopped early) of one response."""
    ops = problem.prompt.split()[1:]
    lines = [ln for ln in text.split("\n") if len(ln) >= 5 and ln[1] == " "]
    wrong = sum(1 for ln, op in zip(lines, ops) if ln[4] != op[1])
    return len(lines), wrong, len(lines) < len(ops)


def measure(name: str, problems: int, samples: int, log) -> dict:
    import torch

    from vapo_engine.rollout.evaluate import scores
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer import streams
    from vapo_engine.trainer.models import load_models, pick_device, resolve_model_path
    task = get_task("builtin:chain")
    path = resolve_model_path(None, task=name, log=log)
    models = load_models(path, value_path=None, need_value=False, reference_path=None, device=pick_device("cpu"),
                         autocast_dtype=None)
    held = task.heldout(problems)
    out = {"model": name, "folder": path.name, "build": _build_record(path)}
    for kind, probs, how in (("greedy", held, {}), ("sampled", [p for p in held for _ in range(samples)],
                                                    {"greedy": False, "temperature": 1.0})):
        with streams.seeded(1, "warm_start", 0), torch.no_grad():
            rewards, gen = scores(models.policy, models.tokenizer, task, probs, max_new_tokens=task.max_new_tokens,
                                  **how)
        for bucket in ("short", "mid", "long", "all"):
            sel = [k for k, p in enumerate(probs) if bucket in ("all", task.bucket(p))]
            errs = [line_errors(task, probs[k], gen.texts[k]) for k in sel]
            out[f"{kind}_{bucket}"] = {
                "accuracy": sum(rewards[k] for k in sel) / len(sel), "responses": len(sel),
                "sign_error_per_line": sum(e[1] for e in errs) / max(1, sum(e[0] for e in errs)),
                "stopped_early": sum(e[2] for e in errs) / len(sel)}
    return out


def _build_record(path: Path) -> dict:
    m = json.loads((path / "sft_metrics.json").read_text(encoding="utf-8"))
    keep = ("steps", "stop_reason", "build_seconds", "start", "start_build_seconds", "torch_threads")
    phases = {k.split("_steps")[0]: v for k, v in m.items() if k.endswith("_steps") and k != "steps"}
    return {**{k: m[k] for k in keep if k in m}, "phase_steps": phases,
            "recipe_phases": [{k: p[k] for k in ("name", "lr", "target", "noise", "teacher_lines") if k in p}
                              for p in m.get("recipe", {}).get("phases", [])]}


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="builtin:chain,builtin:chain@planted-stop,builtin:chain@v1")
    p.add_argument("--problems", type=int, default=140, help="held-out problems (10 per step count at 140)")
    p.add_argument("--samples", type=int, default=4, help="samples per problem for the sampled accuracy")
    p.add_argument("--smoke", action="store_true", help="one model, a few problems (tests)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    names = [n for n in a.models.split(",") if n][:1 if a.smoke else None]
    sizes = (14, 1) if a.smoke else (a.problems, a.samples)
    t0, load0 = time.time(), records.load_avg()
    rows = [measure(n, *sizes, log=print) for n in names]
    for r in rows:
        print(f"{r['model']:>28}: greedy long {r['greedy_long']['accuracy']:.2f}, sampled long "
              f"{r['sampled_long']['accuracy']:.2f}, sign errors per sampled line "
              f"{r['sampled_all']['sign_error_per_line']:.3f}, stopped early {r['sampled_long']['stopped_early']:.2f}")
    record = {"config": {"models": names, "problems": sizes[0], "samples": sizes[1], "smoke": a.smoke},
              "models": rows, "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load0,
              "load_avg_end": records.load_avg()}
    path = records.write_record("warm_start", record, Path(a.out) if a.out else None)
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
