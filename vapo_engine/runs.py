"""Runs as configured objects: create a run directory with its frozen snapshots, load its identity and
config back. Torch-free. The directory's layout and file I/O belong to `vapo_engine.rundir`.
"""
from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config import Settings, TrainConfig
from .config.secrets import safe_channel_view, safe_config_dump, safe_overrides, safe_settings_dump, safe_tags
from .datafiles import read_text
from .errors import UserError
from .providers.redaction import scrub_obj
from .rundir import CONFIG_JSON, RUN_JSON, SETTINGS_JSON, storage_error, write_json_atomic


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


def create_run(config: TrainConfig, settings: Settings, root: Path, *, channel_public: dict | None = None,
               overrides: list[str] | tuple[str, ...] = (), preset: str | None = None,
               run_id: str | None = None, extra: dict | None = None, secrets: Iterable = ()) -> RunInfo:
    """Make the run directory and its frozen snapshots. No secret is written: the channel view is redacted,
    and URL credentials, a key pasted into `api_key_env`, and secret-looking override values and tags are
    redacted (`vapo_engine.config.secrets`), and so is every trace of the known `secrets` (the resolved key,
    whatever its shape); the returned tags — what the registry stores — are the same."""
    run_id = run_id or new_run_id()
    exp = settings.experiment
    known = [x for x in secrets if x]
    clean = (lambda obj: scrub_obj(obj, known) if known else obj)
    tags = tuple(clean(safe_tags(exp.tags)))
    run_dir = root / exp.name / run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise UserError(f"run directory {run_dir} already exists; pick another run id") from None
    except OSError as e:
        raise storage_error(run_dir, e) from None
    write_json_atomic(run_dir / CONFIG_JSON, clean(safe_config_dump(config.model_dump(mode="json"))))
    write_json_atomic(run_dir / SETTINGS_JSON, clean({"settings": safe_settings_dump(settings.model_dump(mode="json")),
                                                      "channel": _safe_channel(channel_public)}))
    write_json_atomic(run_dir / RUN_JSON, clean({"run_id": run_id, "experiment": exp.name, "tags": list(tags),
                                                 "seed": exp.seed, "created": time.time(),
                                                 "overrides": safe_overrides(overrides), "preset": preset,
                                                 **(extra or {})}))
    return RunInfo(run_id, run_dir, exp.name, tags, exp.seed)


def _safe_channel(public: dict | None) -> dict | None:
    """The channel view with the key redacted, base-URL credentials stripped and a pasted key hidden."""
    return safe_channel_view(public)


def load_run(run_dir: str | Path) -> tuple[RunInfo, TrainConfig]:
    """Read a run directory's identity and frozen config."""
    run_dir = Path(run_dir)
    meta = json.loads(read_text(run_dir / RUN_JSON))  # regular files only, never through a link
    config = TrainConfig.model_validate(json.loads(read_text(run_dir / CONFIG_JSON)))
    info = RunInfo(meta["run_id"], run_dir, meta["experiment"], tuple(meta.get("tags", ())), int(meta["seed"]))
    return info, config
