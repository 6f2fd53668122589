"""`python -m vapo_engine.serving.local_eval`: evaluate a model directory in this process, exactly as a run
evaluates its policy (`vapo_engine.rollout.evaluate.evaluate`: the task's held-out problems, greedy accuracy,
sampled avg@k under a forked seeded RNG, per-bucket accuracies), and print one JSON line.

The caller (tools/evaluate.py, which must stay torch-free) sends the spec as JSON on stdin:

    {"model_dir", "benchmark", "data_dir", "num_problems", "samples_per_problem", "max_tokens",
     "temperature", "top_p", "seed", "device", "prompt_format", "system_prompt"}

The prompts are encoded as the run encodes its held-out prompts (`vapo_engine.prompts`: `prompt_format`
"auto" / "plain" / "chat" against this model's tokenizer, `system_prompt` None = the benchmark task's format
instruction); a spec without them means "auto" and the task's instruction.

and reads `{"ok": true, "metrics": {...}, "problems": n, "seconds": s}` from stdout, or
`{"ok": false, "error": "..."}` (exit 2) for a mistake the user can fix. Weights load in float32 (as the run's
evaluation generates), from safetensors only, without trust_remote_code. Logs go to stderr.
"""
from __future__ import annotations

import json
import sys
import time

from vapo_engine.errors import is_user_error


def evaluate_dir(spec: dict) -> dict:
    from vapo_engine.config.train_model import ModelConfig
    from vapo_engine.prompts import resolve_prompt_format
    from vapo_engine.rollout.evaluate import evaluate
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer.models import Models

    from .model import load_served_model

    task = get_task(spec["benchmark"], spec["data_dir"])
    t0 = time.perf_counter()
    served = load_served_model(spec["model_dir"], "local", device=spec.get("device", "auto"), dtype="float32")
    models = Models(served.model, None, None, served.tokenizer, served.device, None, served.source)
    wanted = ModelConfig(prompt_format=spec.get("prompt_format", "auto"), system_prompt=spec.get("system_prompt"))
    fmt = resolve_prompt_format(wanted, served.tokenizer, task, where=str(spec["model_dir"]))
    metrics = evaluate(models, task, num_problems=spec["num_problems"],
                       samples_per_problem=spec["samples_per_problem"], max_new_tokens=spec["max_tokens"],
                       temperature=spec["temperature"], top_p=spec["top_p"], seed=spec["seed"], prompt_format=fmt)
    problems = len(task.heldout(spec["num_problems"]))
    return {"ok": True, "metrics": metrics, "problems": problems, "seconds": time.perf_counter() - t0}


def main() -> int:
    try:
        spec = json.loads(sys.stdin.read())
        out = evaluate_dir(spec)
    except Exception as e:
        if not is_user_error(e):
            raise
        print(json.dumps({"ok": False, "error": str(e)}), flush=True)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
