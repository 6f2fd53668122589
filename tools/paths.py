"""Where the tools find config.toml / settings.json and the runs: explicit paths, else the environment
(`VAPO_MCP_CONFIG`, `VAPO_MCP_SETTINGS`, set by `vapo-mcp serve --config/--settings`), else the working
directory. One place, so every tool resolves the same files."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vapo_engine.config import Settings, load_settings, resolve_channel
from vapo_engine.errors import UserError
from vapo_engine.jobs import RunManager
from vapo_engine.jobs.threads import SETTINGS_ENV
from vapo_engine.runs import runs_root

CONFIG_ENV = "VAPO_MCP_CONFIG"
__all__ = ["CONFIG_ENV", "SETTINGS_ENV", "Files", "ToolInputError", "files", "known_secrets", "manager_for"]


class ToolInputError(UserError):
    """A mistake in a tool's arguments that the caller can fix; the message says how."""


@dataclass(frozen=True)
class Files:
    config: Path
    settings: Path

    @property
    def dotenv(self) -> Path:
        return self.settings.resolve().parent / ".env"


def files(config: str | None = None, settings: str | None = None) -> Files:
    return Files(Path(config or os.environ.get(CONFIG_ENV) or "config.toml"),
                 Path(settings or os.environ.get(SETTINGS_ENV) or "settings.json"))


def manager_for(f: Files, settings: Settings | None = None) -> tuple[RunManager, Settings]:
    """The run manager of these files: runs under runtime.log_dir, workers on this settings.json (never a
    path a run directory names), at most runtime.max_queued_runs waiting."""
    settings = settings or load_settings(f.settings)
    return RunManager(runs_root(settings, f.settings), settings_path=f.settings,
                      max_queued=settings.runtime.max_queued_runs), settings


def known_secrets(f: Files | None = None) -> list:
    """The configured channel's resolved key, for scrubbing messages that may quote it in any shape (a key
    with no recognisable pattern is only caught by its value); [] when it cannot be resolved."""
    try:
        f = f or files()
        channel, _ = resolve_channel(load_settings(f.settings), dotenv_path=f.dotenv)
    except Exception:  # noqa: BLE001 - scrubbing must never fail the error path it protects
        return []
    return channel.secrets()
