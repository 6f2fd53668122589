"""`vapo-mcp serve-model RUN_ID | DIR`: a run's checkpoint (newest verified, or `--step N`) or any Hugging Face
model directory as an OpenAI-compatible endpoint (`/v1/models`, `/v1/chat/completions`, streaming too), so
every channel tool (`check`, `smoke`, `eval --channel`) works against a trained policy.

This module only resolves a run id through the run registry and hands the folder to the worker-side server
(`vapo_engine.serving`, imported when the command runs: torch never loads for other commands). Loopback by
default; another bind needs `VAPO_MCP_TOKEN`, which clients send as their API key.
"""
from __future__ import annotations

from pathlib import Path

from tools.paths import files, manager_for
from vapo_engine.serving.options import add_arguments, options_from

from .common import UserError, add_file_options


def register(sub) -> None:
    p = sub.add_parser("serve-model", help="serve a run's checkpoint or a model directory as an OpenAI-compatible "
                                           "endpoint")
    add_file_options(p)
    add_arguments(p, target_help="a run id (vapo-mcp runs list), a run directory, a Hugging Face model "
                                 "directory, a .gguf file, or builtin:smollm2-135m-instruct")
    p.set_defaults(func=serve_model)


def resolve_target(target: str, config: str, settings: str) -> Path:
    """A folder as given, else a run id looked up in the run registry of settings.json's log dir."""
    from vapo_engine.realmodels.source import is_gguf_spec
    path = Path(target).expanduser()
    if path.is_dir():
        return path
    if is_gguf_spec(target):
        return Path(target) if target.startswith("builtin:") else path
    if "/" in target or target.startswith((".", "~")):
        raise UserError(f"{target}: no such folder; pass an existing run or model directory, or a run id")
    mgr, _ = manager_for(files(config, settings))
    return Path(mgr.get(target).run_dir)


def serve_model(args) -> int:
    target = resolve_target(args.target, args.config, args.settings)
    from vapo_engine.serving.server import run
    run(options_from(args, target))
    return 0
