"""Shared pieces of the benchmarks: machine info, one training run of a variant, curve statistics, records.

A benchmark run is an ordinary engine run (config.toml + the cpu-demo preset + a variant's overrides + the
benchmark's own overrides) trained in-process in a temporary run directory that is deleted afterwards; only
the numbers survive, in `bench/results/<name>.json`. Not a test: nothing here asserts.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PRESET = "cpu-demo"


class ParityReward:
    """A task whose reward is the parity of the response's length plus the answer's: a signal even an untrained
    tiny model's answers get (correct = odd), so a step has non-zero policy and value gradients (a constant zero
    reward with a zero-initialised value head gives zero gradients); the rest is the wrapped task's. Used by
    bench/memory.py and tests/lora_dist_step.py."""

    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    def reward(self, response: str, answer: str) -> float:
        return float((len(response) + len(answer)) % 2)


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


def machine_info() -> dict:
    """CPU model (from /proc/cpuinfo), core counts, torch / transformers / python versions."""
    import torch
    import transformers
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": cpu, "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def command_line() -> str:
    """The exact command that produced a record (paths relative to the repository root)."""
    argv = [os.path.relpath(sys.argv[0], REPO) if sys.argv and sys.argv[0].endswith(".py") else sys.argv[0]]
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", *argv, *sys.argv[1:]])


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
            "sampled": r.get("eval/sampled_accuracy"),
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
    """Means over the training steps of the diagnostics the README discusses."""
    return {"mean_explained_var": _mean_of(records, "critic/explained_var"),
            "pooled_explained_var": pooled_explained_var(records),
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


def spread(values: list[float | None]) -> dict:
    """mean, std (sample, 0 for one value), min, max, n of the non-missing values."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": round(statistics.fmean(v), 4), "std": round(statistics.stdev(v), 4) if len(v) > 1 else 0.0,
            "min": round(min(v), 4), "max": round(max(v), 4), "n": len(v)}


def git_commit() -> str | None:
    """The repository's HEAD commit, "+changes" when the working tree differs from it (None outside git)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10,
                              check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def write_record(name: str, record: dict, out_dir: Path | None = None) -> Path:
    """Write `<out_dir>/<name>.json` (default bench/results) with machine info and the command line."""
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    full = {"benchmark": name, "command": command_line(), "machine": machine_info(), "commit": git_commit(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def save_training_record(name: str, record: dict, out: str | None, runs: list[dict], groups: list[str],
                         title: str) -> Path:
    """The record of a training benchmark plus its curves plot (held-out accuracy per group over seeds)."""
    path = write_record(name, record, Path(out) if out else None)
    plot_curves(path.with_suffix(".png"), {g: [r["curve"] for r in runs if r["variant"] == g] for g in groups}, title)
    return path


def plot_curves(path: Path, groups: dict[str, list[list[dict]]], title: str,
                keys: tuple[str, ...] = ("greedy", "sampled")) -> None:
    """Mean held-out accuracy per group with a min–max band across seeds, one panel per key (Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        colors = plt.cm.tab20.colors if len(groups) > 10 else plt.cm.tab10.colors
        for i, (label, curves) in enumerate(groups.items()):
            _plot_group(ax, label, curves, key, colors[i % len(colors)])
        ax.set_xlabel("policy steps")
        ax.set_ylabel(f"held-out {key} accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_group(ax, label: str, curves: list[list[dict]], key: str, color) -> None:
    steps = sorted({p["step"] for c in curves for p in c})
    rows = [[p[key] for c in curves for p in c if p["step"] == s and p[key] is not None] for s in steps]
    keep = [(s, r) for s, r in zip(steps, rows) if r]
    if not keep:
        return
    xs = [s for s, _ in keep]
    ax.plot(xs, [statistics.fmean(r) for _, r in keep], marker="o", ms=3, label=label, color=color)
    if any(len(r) > 1 for _, r in keep):
        ax.fill_between(xs, [min(r) for _, r in keep], [max(r) for _, r in keep], alpha=0.15, color=color)


def load_avg() -> list[float] | None:
    """1/5/15-minute load averages (other processes share these 2 cores: timings depend on it)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --smoke: a few seconds per run (tiny batch, 8 eval problems, 1 value-pretraining step); for tests only
SMOKE_OVERRIDES = ("training.batch_size=16", "training.mini_batch_size=16", "vapo.value_pretrain_steps=1",
                   "eval.num_problems=8", "eval.samples_per_problem=1")


def parse_seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]
