"""Run directories: create one with frozen snapshots, and read it back. Torch-free.

Layout of `<runtime.log_dir>/<experiment.name>/<run id>/`:
  run.json        identity: id, experiment, tags, seed, created, overrides, preset (written once)
  config.json     the frozen, validated TrainConfig the worker trains with
  settings.json   the settings snapshot + the effective channel (key redacted)
  metrics.jsonl   append-only metrics (trainer)
  checkpoints/    step-N/ folders, each complete only when its DONE marker exists (trainer)
  tb/             TensorBoard event files (trainer)
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from .config import Settings, TrainConfig, redact


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_dir: Path
    experiment: str
    tags: tuple[str, ...]
    seed: int


def runs_root(settings: Settings, settings_path: str | Path | None = None) -> Path:
    """The log_dir, relative paths taken from settings.json's folder (cwd when no path is known)."""
    base = Path(settings_path).resolve().parent if settings_path else Path.cwd()
    p = Path(settings.runtime.log_dir).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON so that readers see the old or the new file, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def create_run(config: TrainConfig, settings: Settings, root: Path, *, channel_public: dict | None = None,
               overrides: list[str] | tuple[str, ...] = (), preset: str | None = None,
               run_id: str | None = None, extra: dict | None = None) -> RunInfo:
    """Make the run directory and its frozen snapshots (no secret is written: the channel view is redacted)."""
    run_id = run_id or new_run_id()
    exp = settings.experiment
    run_dir = root / exp.name / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    write_json_atomic(run_dir / "config.json", config.model_dump(mode="json"))
    write_json_atomic(run_dir / "settings.json", {"settings": settings.model_dump(mode="json"),
                                                  "channel": _safe_channel(channel_public)})
    write_json_atomic(run_dir / "run.json", {"run_id": run_id, "experiment": exp.name, "tags": list(exp.tags),
                                             "seed": exp.seed, "created": time.time(),
                                             "overrides": list(overrides), "preset": preset, **(extra or {})})
    return RunInfo(run_id, run_dir, exp.name, tuple(exp.tags), exp.seed)


def _safe_channel(public: dict | None) -> dict | None:
    if public is None:
        return None
    key = public.get("key", "")
    if key and "…" not in key and not key.startswith("<"):
        public = {**public, "key": redact(key)}
    return public


def load_run(run_dir: str | Path) -> tuple[RunInfo, TrainConfig]:
    """Read a run directory's identity and frozen config."""
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    config = TrainConfig.model_validate(json.loads((run_dir / "config.json").read_text(encoding="utf-8")))
    info = RunInfo(meta["run_id"], run_dir, meta["experiment"], tuple(meta.get("tags", ())), int(meta["seed"]))
    return info, config


def find_run(root: Path, run_id: str) -> Path | None:
    """The directory of a run id under any experiment of `root` (None if absent)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        return None
    hits = [p for p in root.glob(f"*/{run_id}") if (p / "run.json").is_file()]
    return hits[0] if hits else None


def freeze_paths(config: TrainConfig, base_dir: str | Path) -> TrainConfig:
    """Make the config's relative paths (model dirs, data_dir) absolute against `base_dir`, so that the
    frozen copy in a run directory means the same thing from any working directory."""
    base = Path(base_dir).resolve()
    fix = (lambda p: p if p is None or Path(p).expanduser().is_absolute() else str((base / p).resolve()))
    model = config.model.model_copy(update={"local_path": fix(config.model.local_path),
                                            "value_path": fix(config.model.value_path)})
    data = config.data.model_copy(update={"data_dir": fix(config.data.data_dir)})
    return config.model_copy(update={"model": model, "data": data})
