"""Helpers shared by CLI commands: file options, error printing, JSON output."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tools.paths import CONFIG_ENV, SETTINGS_ENV, known_secrets
from vapo_engine.errors import UserError as _UserError
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message


class UserError(_UserError):
    """A mistake the user can fix; printed as one message (with the fix), exit code 2."""


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
