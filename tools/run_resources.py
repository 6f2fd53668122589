"""What the MCP resources of runs contain (server/resources.py serves them): the run list, one run's status, its
recent metrics records, its log tail, a plot and its effective config. Plain functions over the read model of
runs (tools.training.views_for → vapo_engine.jobs.views); no mcp, no torch.

Every text is scrubbed of the channel's key and anything credential-shaped. For a remote (HTTP) caller the files
a resource reads — the run directory and each file in it — must resolve inside the allowed roots, exactly as a
path a tool reads (tools.access): a symlink that points out gets the one fixed refusal, naming the resource URI.
"""
from __future__ import annotations

import io
import json

from vapo_engine.jobs import RunSnapshot
from vapo_engine.providers.redaction import scrub, scrub_obj
from vapo_engine.rundir import CONFIG_JSON, METRICS, PROVIDER_JSON, SETTINGS_JSON, WORKER_LOG

from . import access, training
from .paths import Files, ToolInputError, known_secrets
from .plots import plot_run

LIST_LIMIT = 100
RECENT_RECORDS, RECENT_BYTES = 50, 512 * 1024
LOG_LINES, LOG_CHARS = 200, 32_000
STATUS_LOG_LINES = 20


def run_list(f: Files) -> dict:
    """The list_runs tool's result for the newest runs (any state), scrubbed."""
    return _clean(f, training.list_runs(f, limit=LIST_LIMIT).model_dump(mode="json"))


def run_status(f: Files, run_id: str, uri: str) -> dict:
    """The run_status tool's result for this run, scrubbed."""
    _confined(f, training.views_for(f).get(run_id), uri, METRICS, CONFIG_JSON, WORKER_LOG, PROVIDER_JSON)
    return _clean(f, training.run_status(f, run_id, log_lines=STATUS_LOG_LINES).model_dump(mode="json"))


def run_known(f: Files, run_id: str, uri: str) -> None:
    """Nothing, when the run exists (and, for a remote caller, its folder resolves inside the allowed roots); else
    the tools' error for that run id (a subscription to `uri` is checked so)."""
    _confined(f, training.views_for(f).get(run_id), uri)


def run_metrics(f: Files, run_id: str, uri: str) -> dict:
    """The run's state and progress with its last `RECENT_RECORDS` metrics records (train and eval, in file order),
    read from the end of metrics.jsonl (a torn line is skipped)."""
    snap = _confined(f, training.views_for(f).get(run_id), uri, METRICS, CONFIG_JSON)
    lines = snap.rundir.log_tail(RECENT_RECORDS, RECENT_BYTES, name=METRICS, max_bytes=RECENT_BYTES).splitlines()
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # a torn or hostile line
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return _clean(f, {"run_id": run_id, "state": snap.record.state.value, "step": snap.step,
                      "total_steps": snap.total_steps, "latest_eval": snap.latest_eval, "records": records})


def run_log(f: Files, run_id: str, uri: str) -> str:
    """The last `LOG_LINES` lines of the worker log (at most `LOG_CHARS` characters), scrubbed."""
    snap = _confined(f, training.views_for(f).get(run_id), uri, WORKER_LOG)
    return scrub(snap.rundir.log_tail(LOG_LINES, LOG_CHARS), known_secrets(f))


def run_plot(f: Files, run_id: str, uri: str) -> bytes:
    """The report_metrics plot of the run (PNG bytes), drawn in memory (nothing is written to the run)."""
    snap = _confined(f, training.views_for(f).get(run_id), uri, METRICS)
    records = snap.history.get("train", []) + snap.history.get("eval", [])
    if not records:
        raise ToolInputError(f"run {run_id} has no metrics yet ({snap.record.state.value}); read {uri} again "
                             "after its first step")
    return plot_run(records, io.BytesIO(), f"run {run_id}").getvalue()


def run_config(f: Files, run_id: str, uri: str) -> dict:
    """The run's effective config: the frozen config.json it trains with and its settings snapshot with the
    effective channel (key redacted when the run was created), scrubbed once more."""
    snap = _confined(f, training.views_for(f).get(run_id), uri, CONFIG_JSON, SETTINGS_JSON)
    return _clean(f, {"run_id": run_id, "config": snap.rundir.read_json(CONFIG_JSON),
                      **(snap.rundir.read_json(SETTINGS_JSON) or {"settings": None, "channel": None})})


def _confined(f: Files, snap: RunSnapshot, uri: str, *names: str) -> RunSnapshot:
    """`snap`, once its run directory and the files `names` in it resolve inside the allowed roots (remote callers
    only; else the fixed refusal naming `uri`)."""
    policy = access.current()
    if policy.confines_paths:
        paths = [snap.rundir.path, *(snap.rundir.file(n) for n in names)]
        access.confine_files(paths, access.allowed_roots(f, policy), uri)
    return snap


def _clean(f: Files, data):
    return scrub_obj(data, known_secrets(f))
