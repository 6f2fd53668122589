"""MCP resources: the runs as read-only documents an agent reads and subscribes to, next to the tools.

    vapo://runs                      the run list (list_runs' result, JSON)
    vapo://runs/{run_id}             the run's status (run_status' result, JSON)
    vapo://runs/{run_id}/metrics     its recent metrics records (JSON)
    vapo://runs/{run_id}/log         the worker log tail, scrubbed (text)
    vapo://runs/{run_id}/plot.png    the report_metrics plot (PNG)
    vapo://runs/{run_id}/config      its effective config, redacted (JSON)

The contents come from tools.run_resources. Each read runs under the server's access policy like a tool call: a
run id is checked exactly like the tools' `run_id` argument (same message), and for HTTP clients every file read
must resolve inside the allowed roots (same refusal as the tools). Such errors reach the client as an
invalid-params error carrying the tools' message.

Subscriptions to these URIs (and their bounds) are server.subscriptions'. Imports no torch.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel, ValidationError

from tools import access
from tools import run_resources as contents
from tools.paths import files, known_secrets
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message

from . import arguments as arguments_text

RUNS = "vapo://runs"
PARTS = ("", "/metrics", "/log", "/plot.png")
"""The URIs of a run (after vapo://runs/<id>) whose content changes with its state and evaluations."""
JSON, TEXT, PNG = "application/json", "text/plain", "image/png"
OWN_CHECKS = ResourceSecurity(reject_path_traversal=False, reject_absolute_paths=False, reject_null_bytes=False)
"""The run id is checked by `run_id_of` (the tools' RunId: no '/', no leading '.', no NUL), so the SDK's generic
check would only replace the tools' message by 'Unknown resource'."""


class _RunRef(BaseModel):
    run_id: arguments_text.RunId


def run_uris(run_id: str) -> list[str]:
    return [f"{RUNS}/{run_id}{part}" for part in PARTS]


def run_id_of(value: str) -> str:
    """`value` if it is a run id; else the message the tools give for such a `run_id` argument."""
    try:
        return _RunRef(run_id=value).run_id
    except ValidationError as e:
        raise MCPError(INVALID_PARAMS, arguments_text.describe_validation(
            "resources/read", e, _RunRef.model_json_schema())) from None


async def read_under(policy: access.Policy, fn: Callable, *args):
    """`fn(files, *args)` in a worker thread under `policy`; a user error becomes the client's invalid-params error
    with the tools' (scrubbed) message, anything else stays a crash."""
    try:
        with access.applied(policy):
            return await anyio.to_thread.run_sync(functools.partial(fn, files(), *args))
    except Exception as e:
        if is_user_error(e):
            raise MCPError(INVALID_PARAMS, public_message(e, known_secrets())) from None
        raise


def register_resources(mcp: MCPServer, watch) -> None:
    """Add the run resources to `mcp` (reads under `mcp.policy`) and serve their subscriptions (`watch`, a
    server.subscriptions.RunWatch)."""
    def read(fn: Callable, *args):
        return read_under(mcp.policy, fn, *args)

    def per_run(part: str, fn: Callable, mime: str, name: str, title: str, describe: str, encode=json.dumps):
        uri = f"{RUNS}/{{run_id}}{part}"

        async def resource(run_id: str):
            run_id = run_id_of(run_id)
            return encode(await read(fn, run_id, uri.replace("{run_id}", run_id)))
        mcp.resource(uri, name=name, title=title, description=describe, mime_type=mime, security=OWN_CHECKS)(resource)

    @mcp.resource(RUNS, name="runs", title="Runs", mime_type=JSON)
    async def runs() -> str:
        """Runs newest first (the list_runs result): state, progress, latest held-out accuracy."""
        return json.dumps(await read(contents.run_list))

    per_run("", contents.run_status, JSON, "run_status", "Run status",
            "A run's state with its message, step/total, latest evaluation, log tail and next steps (run_status).")
    per_run("/metrics", contents.run_metrics, JSON, "run_metrics", "Run metrics",
            f"A run's progress and its last {contents.RECENT_RECORDS} metrics records (train and eval).")
    per_run("/log", contents.run_log, TEXT, "run_log", "Run log",
            f"The last {contents.LOG_LINES} lines of a run's worker log (secrets redacted).", encode=str)
    per_run("/plot.png", contents.run_plot, PNG, "run_plot", "Run plot",
            "A run's curves (reward, length, held-out accuracy, explained variance, λ, entropy) as a PNG.",
            encode=bytes)
    per_run("/config", contents.run_config, JSON, "run_config", "Run config",
            "A run's effective config: the frozen config.json and its settings snapshot (key redacted).")
    watch.serve_subscriptions(mcp)
