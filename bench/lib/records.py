"""Benchmark records: `bench/results/<name>.json` with the machine, the command, the commit and the date.

A record is written once its benchmark has run (`write_record`); a training benchmark also gets its curves
plot (`save_training_record`). The command is the one that reproduces the record from the repository root.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .plots import plot_curves

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


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
    """The exact command that produced a record, as typed at the repository root: `.venv/bin/python -m
    bench.<group>.<name> ARGS` for a module (a script run by its path keeps that path, relative to the root)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        head = ["-m", spec.name]
    elif sys.argv and sys.argv[0].endswith(".py"):
        head = [os.path.relpath(sys.argv[0], REPO)]
    else:
        head = sys.argv[:1]
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", *head, *sys.argv[1:]])


def git_commit() -> str | None:
    """The repository's HEAD commit, "+changes" when the working tree differs from it (None outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10,
                              check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def load_avg() -> list[float] | None:
    """1/5/15-minute load averages (other processes share these 2 cores: timings depend on it)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


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
