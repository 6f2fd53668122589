"""Real runs with real symptoms on builtin:chain, kept as test fixtures for the training diagnostics.

Each case is a short chain run (preset chain-planted-stop on the v1 chain model, `model.builtin =
builtin:chain@v1`: the model the committed fixtures were recorded on) with one thing broken on purpose (and one
healthy run); its config.json,
metrics.jsonl, summary.json and run.json are copied to tests/data/chain_runs/<case>/, and
tests/test_diagnose_chain_runs.py checks that the rule for that symptom fires on it and that the healthy run
stays quiet. Re-run this script when the task, the model or the rules change:

    .venv/bin/python -m scripts.record_chain_runs [--steps 36] [--out tests/data/chain_runs]
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.lib.records import REPO, load_avg
from bench.lib.runs import settings_with_seed

PRESET = "chain-planted-stop"
SHAPE = ["model.builtin=\"builtin:chain@v1\"", "training.batch_size=32", "training.mini_batch_size=32",
         "eval.num_problems=56", "eval.eval_interval=12",
         "eval.save_interval=1000", "vapo.value_pretrain_steps=8", "vapo.value_pretrain_patience=0"]
CASES: dict[str, tuple[list[str], list[str]]] = {
    # name: (overrides, the training rules that must fire)
    "healthy": ([], []),
    "value_collapse": (["vapo.value_pretrain_steps=0", "vapo.value_learning_rate=1e-7"], ["train-value-collapse"]),
    "lambda_collapsed": (["vapo.alpha=0.005"], ["train-lambda-collapsed"]),
    # no "length not growing" case: the fixtures were recorded on the v1 chain model, whose answers' length is set
    # by the prompt's step count (the batch's mix moves the mean by ±30 tokens step to step); tests/
    # test_diagnose_training.py covers that rule on a synthetic run. On v2 (stops long chains after 8 lines)
    # length grows when RL works (63 -> 77 tokens in the demo), so a stalled run would show it: not recorded yet.
    # meant to oscillate; measured: the policy collapses to reward 0 within ~9 steps (no oscillation), which is
    # what the accuracy-drop rule is for (the oscillation rule is covered by a synthetic run)
    "collapse": (["training.learning_rate=3e-3", "vapo.clip_higher=false", "training.clip_range=0.9",
                  "vapo.whiten_advantages=false"], ["train-accuracy-dropped"]),
}
KEEP = ("config.json", "metrics.jsonl", "summary.json", "run.json")


def run_case(name: str, overrides: list[str], steps: int, tmp: Path, out: Path) -> dict:
    from vapo_engine.config import load_config
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    over = [*SHAPE, f"training.total_steps={steps}", *overrides]
    cfg = load_config(REPO / "config.toml", over, preset=PRESET)
    info = create_run(cfg, settings_with_seed(1), tmp, run_id=name, overrides=over, preset=PRESET)
    t0 = time.perf_counter()
    train(info.run_dir, log=lambda m: None)
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in KEEP:
        if (info.run_dir / f).is_file():
            shutil.copy(info.run_dir / f, dest / f)
    return {"case": name, "overrides": overrides, "seconds": round(time.perf_counter() - t0, 1)}


def fired(run_dir: Path) -> list[str]:
    from tools.diagnose import diagnose_error
    d = diagnose_error(run_dir=run_dir)
    return sorted(f.rule_id for f in d.findings if f.category == "training" and f.rule_id != "train-paper-mismatch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=36, help="policy steps per case")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "chain_runs"))
    a = ap.parse_args()
    out = Path(a.out)
    t0, load0, rows = time.perf_counter(), load_avg(), []
    with tempfile.TemporaryDirectory(prefix="vapo-diag-") as tmp:
        for name in a.cases.split(","):
            overrides, expected = CASES[name]
            row = run_case(name, overrides, a.steps, Path(tmp), out)
            row |= {"expected": expected, "fired": fired(out / name)}
            print(f"{name:20} expected {expected}  fired {row['fired']}  ({row['seconds']:.0f}s)", flush=True)
            rows.append(row)
    manifest = {"preset": PRESET, "shape": SHAPE, "steps": a.steps, "cases": rows,
                "wall_s_total": round(time.perf_counter() - t0, 1), "load_avg_start": load0, "load_avg_end": load_avg()}
    (out / "cases.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
