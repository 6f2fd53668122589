"""Training runs of the benchmarks: one variant trained in-process, and the statistics of its curves.

A benchmark run is an ordinary engine run (config.toml + the cpu-demo preset + a variant's overrides + the
benchmark's own overrides) trained in-process in a temporary run directory that is deleted afterwards; only
the numbers survive, in the benchmark's record (bench/lib/records.py). Not a test: nothing here asserts.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from .records import REPO

PRESET = "cpu-demo"


class ParityReward:
    """A task whose reward is the parity of the response's length plus the answer's: a signal even an untrained
    tiny model's answers get (correct = odd), so a step has non-zero policy and value gradients (a constant zero
    reward with a zero-initialised value head gives zero gradients); the rest is the wrapped task's. Used by
    bench/perf/memory.py and tests/lora_dist_step.py."""

    verifier = "task"  # scored by reward() below, not by the wrapped task's default verifier (tasks/verifiers.py)

    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    def reward(self, response: str, answer: str) -> float:
        return float((len(response) + len(answer)) % 2)


def reward_parity(tr) -> None:
    """Score a built trainer's training rollouts with `ParityReward` (its judge was made for the plain task)."""
    tr.task, tr.judge = ParityReward(tr.task), None  # None: the task's own default verifier, here its reward()


def random_head_value_dir(model_dir, out) -> Path:
    """A value model of `model_dir`'s architecture saved to `out` with a random scalar head (N(0, 0.1), seed 0)
    instead of the engine's zero start: values, GAE advantages and value losses, hence every gradient of a step,
    are non-zero even when no reward is earned — parity checks that compare zeros with zeros prove nothing."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification
    cfg = AutoConfig.from_pretrained(model_dir, num_labels=1, trust_remote_code=False)
    cfg.classifier_dropout = 0.0
    value = AutoModelForTokenClassification.from_pretrained(model_dir, config=cfg, dtype=torch.float32,
                                                               trust_remote_code=False)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in (getattr(value, "score", None) or value.classifier).parameters():
            p.normal_(0.0, 0.1)
    value.save_pretrained(out)
    return Path(out)


def load_bench_config(variant: str, extra: list[str] | tuple[str, ...] = (), preset: str = PRESET):
    """config.toml + the preset + `extra` + the variant's overrides (last: a row is what its variant says, e.g.
    `vapo.value_pretrain_steps=5` on every row leaves w/o value pretraining at 0); returns (config, overrides)."""
    from vapo_engine.config import load_config
    from vapo_engine.variants import get_variant
    base = load_config(REPO / "config.toml", list(extra), preset=preset)
    overrides = [*extra, *get_variant(variant).apply(base)]
    return load_config(REPO / "config.toml", overrides, preset=preset), overrides


def settings_with_seed(seed: int):
    from vapo_engine.config import load_settings
    s = load_settings(REPO / "settings.json")
    return s.model_copy(update={"experiment": s.experiment.model_copy(update={"seed": seed, "name": "bench"})})


def run_variant(variant: str, seed: int, steps: int, eval_interval: int, extra: tuple[str, ...] = (),
                log=None, preset: str = PRESET, run_json: dict | None = None, keep_in: Path | None = None,
                name: str | None = None) -> dict:
    """Train one variant for `steps` policy steps with `seed`; returns the per-run record (curve, final, time).
    `run_json`: extra run.json entries; `keep_in`: keep the run
    directory there (e.g. to serve its checkpoint) instead of a deleted temporary folder."""
    from vapo_engine.rundir import RunDir
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    over = (f"training.total_steps={steps}", f"eval.eval_interval={eval_interval}",
            f"eval.save_interval={10 * steps}", *extra)
    config, overrides = load_bench_config(variant, over, preset)
    with tempfile.TemporaryDirectory(prefix="vapo-bench-") as tmp:
        info = create_run(config, settings_with_seed(seed), Path(keep_in or tmp), run_id=name or f"{variant}-s{seed}",
                          overrides=overrides, preset=preset, extra=run_json)
        t0 = time.perf_counter()
        summary = train(info.run_dir, log=log or (lambda s: None))
        wall = time.perf_counter() - t0
        records = RunDir(info.run_dir).metrics()
    final = summary["final_eval"]
    return {"variant": variant, "seed": seed, "steps": summary.get("steps"), "wall_s": round(wall, 1),
            "run_dir": str(info.run_dir) if keep_in else None, "last_train": _last_train(records),
            "overrides": overrides, "curve": eval_curve(records), **train_stats(records),
            "final_greedy": final.get("eval/greedy_accuracy"), "final_sampled": final.get("eval/sampled_accuracy"),
            **{f"final_greedy_{b}": final[f"eval/greedy_accuracy_{b}"] for b in ("short", "mid", "long")
               if f"eval/greedy_accuracy_{b}" in final}}


def _last_train(records: list[dict]) -> dict:
    train = [r for r in records if r.get("kind") == "train"]
    return {k: v for k, v in (train[-1] if train else {}).items() if isinstance(v, (int, float))}


def eval_curve(records: list[dict]) -> list[dict]:
    """[{step, greedy, sampled, time}] from the eval records, in step order (time: seconds since the first)."""
    t0 = min((r["time"] for r in records if isinstance(r.get("time"), (int, float))), default=None)
    pts = [{"step": int(r["step"]), "greedy": r.get("eval/greedy_accuracy"),
            "time_s": round(r["time"] - t0, 1) if t0 is not None and isinstance(r.get("time"), (int, float))
            else None,
            "sampled": r.get("eval/sampled_accuracy"), "critic_ev_within_prompt": r.get("eval/critic_ev_within_prompt"),
            **{f"greedy_{b}": r[f"eval/greedy_accuracy_{b}"] for b in ("short", "mid", "long")
               if f"eval/greedy_accuracy_{b}" in r}} for r in records if r.get("kind") == "eval"]
    return sorted(pts, key=lambda p: p["step"])


def _mean_of(records: list[dict], name: str, kind: str = "train") -> float | None:
    vals = [float(r[name]) for r in records if r.get("kind") == kind and isinstance(r.get(name), (int, float))]
    return round(statistics.fmean(vals), 4) if vals else None


def pooled_explained_var(records: list[dict]) -> float | None:
    """The critic's EV pooled over the training steps: 1 − Σ(1 − EV)·var / Σ var (var = the step's return
    variance), i.e. residual variance over return variance summed across steps, not a mean of ratios (a step
    with near-constant returns has a wild ratio and almost no weight here)."""
    pairs = [(r["critic/explained_var"], r["critic/return_var"]) for r in records if r.get("kind") == "train"
             and isinstance(r.get("critic/explained_var"), (int, float)) and isinstance(r.get("critic/return_var"),
                                                                                         (int, float))]
    total = sum(v for _, v in pairs)
    return round(1 - sum((1 - ev) * v for ev, v in pairs) / total, 4) if total > 0 else None


def train_stats(records: list[dict]) -> dict:
    """Means over the training steps of the run diagnostics the benchmarks report."""
    return {"mean_explained_var": _mean_of(records, "critic/explained_var"),
            "pooled_explained_var": pooled_explained_var(records),
            "mean_explained_var_within_prompt": _mean_of(records, "critic/explained_var_within_prompt"),
            "pretrain_explained_var_within_prompt_last": _last(records, "critic/pretrain_explained_var_within_prompt",
                                                               "pretrain"),
            "pretrain_explained_var_last": _last(records, "critic/pretrain_explained_var", "pretrain"),
            "mean_response_length": _mean_of(records, "rollout/response_length"),
            "mean_lambda_policy": _mean_of(records, "vapo/lambda_policy_mean"),
            "mean_no_signal_groups": _mean_of(records, "rollout/no_signal_groups"),
            "mean_train_accuracy": _mean_of(records, "rollout/accuracy"),
            "mean_step_time_s": _mean_of(records, "perf/step_time_s"),
            "pretrain_rounds": sum(1 for r in records if r.get("kind") == "pretrain")}


def _last(records: list[dict], name: str, kind: str) -> float | None:
    vals = [float(r[name]) for r in records if r.get("kind") == kind and isinstance(r.get(name), (int, float))]
    return round(vals[-1], 4) if vals else None


def steps_to_target(curve: list[dict], target: float, key: str = "greedy") -> int | None:
    """First evaluated step whose accuracy reaches `target` (None = not reached within the run)."""
    for p in curve:
        if p.get(key) is not None and p[key] >= target:
            return p["step"]
    return None


# --smoke: a few seconds per run (tiny batch, 8 eval problems, 1 value-pretraining step); for tests only
SMOKE_OVERRIDES = ("training.batch_size=16", "training.mini_batch_size=16", "vapo.value_pretrain_steps=1",
                   "eval.num_problems=8", "eval.samples_per_problem=1")


def parse_seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]
