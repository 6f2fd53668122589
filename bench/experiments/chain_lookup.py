"""Where a policy fails on `builtin:chain`: teacher-forced probability of each line's operation sign and digit.

For held-out chains of every length (1-14 steps), feed the reference solution and read the policy's probability
of the right sign and the right digit in every line (both are copied from the prompt: `h 92+7=99` for `h+7`).
A line the model reads right has P ≈ 1; a lookup it has not learnt sits near the 50/50 of the two signs. The
table is by prompt length: the mean over the *middle* lines (all but the first and the last two, which are
read from the prompt's ends) and the share of lines below 0.5. Each policy directory given is measured on the
same problems (e.g. the built-in warm-start and a trained checkpoint's `policy/`).

    .venv/bin/python -m bench.experiments.chain_lookup                       # the built-in chain model
    .venv/bin/python -m bench.experiments.chain_lookup --policy RUN/checkpoints/step-0000120/policy
    .venv/bin/python -m bench.experiments.chain_lookup --smoke --out /tmp/x  # a tiny random model, seconds
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.lib.records import load_avg, write_record


def lookup_probs(model, tokenizer, task, per_length: int) -> dict[int, dict]:
    """{steps: {sign_by_line, digit_by_line, sign_middle, digit_middle, sign_below_half, problems}}."""
    import torch

    by: dict[int, dict[str, list[list[float]]]] = {}
    with torch.no_grad():
        for p in task.heldout(per_length * (task.max_steps - task.min_steps + 1)):
            n = task.steps_of(p.prompt)
            pids = tokenizer(p.prompt)["input_ids"]
            ids = torch.tensor([pids + tokenizer(task.solve(p.prompt), add_special_tokens=False)["input_ids"]])
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            rows = by.setdefault(n, {"sign": [[] for _ in range(n)], "digit": [[] for _ in range(n)]})
            for k in range(n):
                sign = sign_position(len(pids), k)
                for name, pos in (("sign", sign), ("digit", sign + 1)):
                    rows[name][k].append(float(lp[pos - 1, ids[0, pos]].exp()))
    out = {}
    for n, rows in sorted(by.items()):
        middle = list(range(1, max(1, n - 2)))
        out[n] = {"sign_by_line": [round(mean(x), 3) for x in rows["sign"]],
                  "digit_by_line": [round(mean(x), 3) for x in rows["digit"]],
                  "sign_middle": None if not middle else round(mean([v for k in middle for v in rows["sign"][k]]), 3),
                  "digit_middle": None if not middle else round(mean([v for k in middle for v in rows["digit"][k]]), 3),
                  "sign_below_half": round(mean([float(v < 0.5) for x in rows["sign"] for v in x]), 3),
                  "problems": len(rows["sign"][0])}
    return out


def sign_position(prompt_tokens: int, line: int) -> int:
    """Index of line `line`'s sign in prompt + reference response (one token a character: `h 92+7=99\\n` is
    label, space, two digits, then the sign)."""
    from vapo_engine.tasks.chain import LINE
    return prompt_tokens + LINE * line + 4


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _load(path: str | None, smoke: bool):
    from transformers import AutoModelForCausalLM

    from vapo_engine.rollout.tokenizer import load_tokenizer
    if smoke:
        from vapo_engine.builtin_model.model import build_tokenizer, make_model
        tok = build_tokenizer()
        return make_model(tok, hidden=16, layers=1, heads=2, seed=0).eval(), tok, "random hidden-16 model"
    name = path or "builtin:chain"
    if name.startswith("builtin:"):  # a built-in model by name (recorded as its name, not a cache path)
        from vapo_engine.builtin_model import builtin_model_dir
        path = str(builtin_model_dir(task=name))
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False).eval(), load_tokenizer(path), name


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", action="append", default=[], help="policy directory or built-in model name, e.g. "
                    "builtin:chain@v1 (repeatable; the default chain model builtin:chain is always measured first)")
    ap.add_argument("--per-length", type=int, default=30, help="held-out problems per step count (default 30)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model on 2 problems per length")
    ap.add_argument("--out", default=None, help="output folder (default bench/results)")
    args = ap.parse_args(argv)
    from vapo_engine.tasks.chain import ChainTask
    t0, load0, task = time.time(), load_avg(), ChainTask()
    per = 2 if args.smoke else args.per_length
    models = [None] + ([] if args.smoke else [p for p in dict.fromkeys(args.policy) if p != "builtin:chain"])
    results = []
    for path in models:
        model, tok, name = _load(path, args.smoke)
        table = lookup_probs(model, tok, task, per)
        results.append({"policy": name, "by_steps": table})
        print(f"{name}:")
        for n, r in table.items():
            print(f"  {n:2d} steps: sign P(right), middle lines {r['sign_middle']}, lines below 0.5 "
                  f"{r['sign_below_half']:.0%}; digit {r['digit_middle']}")
    rec = {"config": {"per_length": per, "smoke": args.smoke}, "results": results,
           "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load0, "load_avg_end": load_avg()}
    path = write_record("chain_lookup", rec, Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return rec


if __name__ == "__main__":
    main()
