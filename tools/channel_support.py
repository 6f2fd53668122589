"""Shared by the channel tools: load the channel from the two files, report progress to sync/async callbacks,
and scrub a result of the channel key before it leaves a tool."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from vapo_engine.config import Channel, load_config, load_settings, resolve_channel
from vapo_engine.providers import scrub_model

log = logging.getLogger("tools.channel")
R = TypeVar("R", bound=BaseModel)
Progress = Callable[[float, str], Any | Awaitable[Any]]
"""`on_progress(fraction, message)`; may be a coroutine function (an MCP context's report_progress)."""


def load_channel(settings_path: str | Path = "settings.json", config_path: str | Path | None = "config.toml",
                 env: Mapping[str, str] | None = None) -> Channel:
    """settings.json (+ config.toml for timeout/max_retries, + .env next to settings.json) → `Channel`.
    A missing config.toml is skipped (defaults); problems raise `ConfigError` naming file, key and fix."""
    settings = load_settings(settings_path)
    config = load_config(config_path) if config_path is not None and Path(config_path).is_file() else None
    channel, _ = resolve_channel(settings, config, env=env, dotenv_path=Path(settings_path).resolve().parent
                                 / ".env", settings_file=str(settings_path))
    return channel


async def report_progress(cb: Progress | None, fraction: float, message: str) -> None:
    """Call a sync or async progress callback; its failures never break the operation."""
    if cb is None:
        return
    try:
        out = cb(min(1.0, max(0.0, fraction)), message)
        if hasattr(out, "__await__"):
            await out
    except Exception as e:  # noqa: BLE001 - progress is best-effort
        log.debug("progress callback failed: %s", e)


def scrubbed(result: R, channel: Channel) -> R:
    """`result` with every string scrubbed of the channel's secrets (`Channel.secrets`: the key, credential
    headers, base-URL credentials) and of credential-shaped text: the last check
    before a tool returns. The client already scrubs what the server sends; this also covers what was built
    from it. A "key" that is just the variable's name (a common mistake) is public and stays readable."""
    key = channel.key.reveal().strip() if channel.key else ""
    others = channel.secrets()[1 if channel.key else 0:]  # credential headers, base-URL user:password@
    return scrub_model(result, [*([channel.key] if key and key != channel.api_key_env else []), *others])
