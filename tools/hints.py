"""Next-step hints for the caller: MCP tool calls for an agent, `vapo-mcp` commands for a person at the CLI.

Every hint is written once, as a tool call (`resume_run('ID')`, `stop_run('ID', force=True)`, `list_runs`),
where it is made: the run manager's state messages and errors, the run read model's next steps. At the CLI,
`for_cli` rewrites the tool calls in such a text into the matching command, using `CLI_COMMANDS` (the one
mapping), so the messages themselves are never duplicated. `for_caller` does that only when the current caller
is the CLI (tools.access), so tool results keep the tool-call wording.
"""
from __future__ import annotations

import re
from pathlib import Path

from vapo_engine.rundir import WORKER_LOG

from . import access

CLI_COMMANDS: dict[str, str] = {
    "resume_run": "vapo-mcp runs resume",
    "stop_run": "vapo-mcp runs stop",
    "run_status": "vapo-mcp runs status",
    "list_runs": "vapo-mcp runs list",
    "report_metrics": "vapo-mcp report",
    "start_training": "vapo-mcp train",
    "check_channel": "vapo-mcp check",
    "diagnose_error": "vapo-mcp diagnose",
}
"""Tool name → the CLI command that does the same (its run id, when it takes one, comes after it)."""
TAKES_RUN_ID = frozenset({"resume_run", "stop_run", "run_status", "report_metrics"})

_NAMES = "|".join(CLI_COMMANDS)
_DUAL = r"(?!\s*/\s*vapo-mcp)"  # "stop_run / vapo-mcp runs stop": the text names the command already
_CALL = re.compile(rf"\b({_NAMES})\(([^()]*)\){_DUAL}")
_BARE = re.compile(rf"(?<![\w.'\"/-])({_NAMES})\b(?![(\w]){_DUAL}")
_ARG = re.compile(r"^\s*(?:(\w+)\s*=\s*)?(?:'([^']*)'|\"([^\"]*)\"|(\w+))\s*$")


def for_cli(text: str, *, run_id: str | None = None, run_dir: str | Path | None = None) -> str:
    """`text` with each tool call spelled as its `vapo-mcp` command: `resume_run('r-1')` → `vapo-mcp runs resume
    r-1`, `stop_run('r-1', force=True)` → `vapo-mcp runs stop r-1 --force`, `list_runs(state='running')` →
    `vapo-mcp runs list --state running`; a bare name (`resume_run continues it`) gets `run_id` (else RUN_ID) when
    its command takes one; a name the text already pairs with its command (`stop_run / vapo-mcp runs stop`) is
    kept. `diagnose_error(run_id=…)` becomes `vapo-mcp diagnose --log <run_dir>/worker.log`
    when `run_dir` is given. A call whose arguments have no CLI spelling is left as it is."""
    text = _CALL.sub(lambda m: _command(m.group(1), m.group(2), run_dir) or m.group(0), text)
    return _BARE.sub(lambda m: _bare(m.group(1), run_id, run_dir), text)


def for_caller(text: str, **where) -> str:
    """`for_cli(text, **where)` when the current caller is the CLI; the tool-call wording for a tool call."""
    return text if access.current().is_tool_call else for_cli(text, **where)


def _command(tool: str, args: str, run_dir) -> str | None:
    parts = [p for p in args.split(",") if p.strip()]
    words = [CLI_COMMANDS[tool]]
    for part in parts:
        m = _ARG.match(part)
        if m is None:
            return None
        key, value = m.group(1), next(v for v in m.group(2, 3, 4) if v is not None)
        if key in (None, "run_id") and tool == "diagnose_error":
            if run_dir is None:
                return None
            words.append(f"--log {Path(run_dir) / WORKER_LOG}")
        elif key in (None, "run_id"):
            words.append(value)
        elif value == "True":
            words.append(f"--{key.replace('_', '-')}")
        elif value not in ("False", "None"):
            words.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(words)


def _bare(tool: str, run_id: str | None, run_dir) -> str:
    if tool == "diagnose_error" and run_dir is not None:
        return f"{CLI_COMMANDS[tool]} --log {Path(run_dir) / WORKER_LOG}"
    return f"{CLI_COMMANDS[tool]} {run_id or 'RUN_ID'}" if tool in TAKES_RUN_ID else CLI_COMMANDS[tool]
