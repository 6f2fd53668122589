"""The project's cache folder (built-in model builds, converted GGUF models). Torch-free."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$VAPO_MCP_CACHE`, else `~/.cache/vapo-mcp`."""
    if cache_dir is None:
        cache_dir = os.environ.get("VAPO_MCP_CACHE") or Path.home() / ".cache" / "vapo-mcp"
    return Path(cache_dir).expanduser()
