"""Helpers shared by CLI commands: file options, error printing, JSON output."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tools.hints import for_cli
from tools.paths import CONFIG_ENV, SETTINGS_ENV, known_secrets
from vapo_engine.errors import UserError as _UserError
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message
from vapo_engine.serving.options import int_in


class UserError(_UserError):
    """A mistake the user can fix; printed as one message (with the fix), exit code 2."""


def positive_int(hi: int, lo: int = 1):
    """An argparse type: an integer in lo..hi (argparse prints the message and exits 2 otherwise)."""
    return int_in(lo, hi)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: pass one in 1..65535") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number: pass one in 1..65535")
    return value


def run_request_error(e: Exception) -> UserError:
    """A run-manager or tool-input error as the CLI's: the tool calls it suggests (`resume_run('ID')`,
    `list_runs`) are spelled as `vapo-mcp` commands (tools.hints)."""
    return UserError(for_cli(str(e)))


def add_file_options(p) -> None:
    """--config / --settings, defaulting to $VAPO_MCP_CONFIG / $VAPO_MCP_SETTINGS, then ./config.toml etc."""
    p.add_argument("--config", default=os.environ.get(CONFIG_ENV, "config.toml"),
                   help=f"training recipe (default: ${CONFIG_ENV} or ./config.toml)")
    p.add_argument("--settings", default=os.environ.get(SETTINGS_ENV, "settings.json"),
                   help=f"channel/runtime settings (default: ${SETTINGS_ENV} or ./settings.json)")


def add_trust_option(p) -> None:
    p.add_argument("--trust-run-config", action="store_true",
                   help="resume even when the run's saved config.json sets what a tool call may not (where a run "
                        "listens, rollout.urls / token_env, logging.mlflow_tracking_uri, more processes than cores): "
                        "only for a run directory nobody else can write")


def add_json_option(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def dotenv_for(settings_path: str) -> Path:
    """The .env file that goes with a settings.json: the one in the same folder."""
    return Path(settings_path).resolve().parent / ".env"


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def report_error(e: BaseException) -> bool:
    """Print a user error (vapo_engine.errors: the one contract the MCP server uses too) without a traceback;
    return False for anything that is a bug."""
    if is_user_error(e):
        print(f"error: {public_message(e, known_secrets())}", file=sys.stderr)
        return True
    return False
