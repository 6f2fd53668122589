"""`diagnose_error`: ranked findings (cause, evidence, fix) from whatever the user has (docs/design.md §4).

Inputs, all optional: an HTTP status, an error body, response headers, exception/traceback/log text (or a log
file), settings.json / config.toml, a code path to scan, a base URL and model id, and a training run directory
(its config.json, metrics.jsonl, summary.json and worker.log tail; the MCP layer resolves run ids to run dirs).
They are turned into one scrubbed `Evidence` (vapo_engine.diagnostics.gather) and evaluated against the
knowledge base (`vapo_engine/diagnostics/rules_*.json`): HTTP, config, code and training-metric rules are
ranked together.

For a remote (HTTP) caller, `log_path` and `code_path` — and every file a code scan would read — must resolve
inside the allowed roots (tools.access); outside ones get the same refusal whether or not they exist.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from vapo_engine.diagnostics import Diagnosis, Finding, diagnose, gather_evidence, load_rules
from vapo_engine.diagnostics.scan import iter_files
from vapo_engine.errors import is_user_error

from . import access
from .paths import Files, ToolInputError
from .paths import files as default_files

MAX_LOG_BYTES = 256_000

__all__ = ["Diagnosis", "Finding", "diagnose_error", "list_rules"]


def _read_log(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise ToolInputError(f"log file {str(p)!r} not found: pass an existing file (or the text itself)")
    size = p.stat().st_size
    with p.open("rb") as f:
        if size > MAX_LOG_BYTES:
            f.seek(size - MAX_LOG_BYTES)
        return f.read().decode("utf-8", "replace")


def diagnose_error(*, status: int | None = None, body: str | None = None,
                   headers: Mapping[str, str] | Iterable[str] | None = None, text: str | None = None,
                   log_path: str | Path | None = None, settings_path: str | Path | None = None,
                   config_path: str | Path | None = None, code_path: str | Path | None = None,
                   base_url: str | None = None, model: str | None = None, history: list[int] | None = None,
                   env: Mapping[str, str] | None = None, run_dir: str | Path | None = None,
                   limit: int = 10, files: Files | None = None) -> Diagnosis:
    """Diagnose an API/config/code problem or a training run. Raises `ToolInputError` for unusable arguments
    (bad status, missing log file, malformed header, a `run_dir` that is not a run directory, a path a remote
    caller may not read; `files` names the project for the latter, default: the server's files); problems *in*
    the files are findings, not exceptions. With `run_dir`, the worker.log tail is analysed like `text` too,
    and `text` is also read as the question (e.g. "why doesn't my AIME score match the paper?")."""
    if status is not None and not 100 <= int(status) <= 599:
        raise ToolInputError(f"status {status} is not an HTTP status code: pass one in 100-599")
    if not 1 <= limit <= 50:
        raise ToolInputError("limit must be between 1 and 50: pass a limit in that range")
    log_path, code_path = _confined(log_path, code_path, files)  # a remote caller's odd path: the one refusal
    for name, value in (("log_path", log_path), ("code_path", code_path), ("run_dir", run_dir)):
        if value is not None and any(ord(c) < 32 for c in str(value)):
            raise ToolInputError(f"{name} contains a NUL or other control character, which no path can hold: "
                                 "pass the path without it")
    if log_path is not None:
        text = "\n".join(t for t in (text, _read_log(log_path)) if t)
    if code_path is not None and not Path(code_path).exists():
        from vapo_engine.providers.redaction import (
            scrub,  # the path is echoed: a key pasted as one is redacted
        )
        raise ToolInputError(f"code path not found: {scrub(str(code_path))!r}; pass an existing file or folder "
                             "to scan")
    try:
        ev = gather_evidence(status=status, body=body, headers=headers, text=text, settings_path=settings_path,
                             config_path=config_path, code_path=code_path, env=env, model=model,
                             base_url=base_url, history=history, run_dir=run_dir)
    except ValueError as e:  # gather_evidence's documented argument errors (header shape, run_dir)
        if is_user_error(e):
            raise
        raise ToolInputError(str(e)) from None
    return diagnose(ev, limit=limit)


def _confined(log_path, code_path, files: Files | None):
    """The paths to read: as given for local callers; resolved inside the allowed roots for remote ones."""
    policy = access.current()
    if not policy.confines_paths or (log_path is None and code_path is None):
        return log_path, code_path
    f = files or default_files()
    roots = access.allowed_roots(f, policy)
    if log_path is not None:
        log_path = access.confine(log_path, f, policy, roots=roots)
    if code_path is not None:
        shown, code_path = code_path, access.confine(code_path, f, policy, roots=roots)
        access.confine_files(iter_files(code_path), roots, shown)
    return log_path, code_path


def list_rules() -> list[dict]:
    """The knowledge base: id, category, severity and title of every rule."""
    return [{"id": r.id, "category": r.category, "severity": r.severity, "title": r.title} for r in load_rules()]
