"""tools.hints: a message written with tool calls, as the CLI prints it."""
from __future__ import annotations

import pytest

from tools.hints import for_cli


@pytest.mark.parametrize("text, cli", [
    ("resume_run('r-1') continues it", "vapo-mcp runs resume r-1 continues it"),
    ("stop it first (stop_run('r-1', force=True)) or wait", "stop it first (vapo-mcp runs stop r-1 --force) or wait"),
    ("list_runs(state='running') shows them", "vapo-mcp runs list --state running shows them"),
    ("resume_run continues from the checkpoint", "vapo-mcp runs resume r-9 continues from the checkpoint"),
    ("then check_channel; start_training again", "then vapo-mcp check; vapo-mcp train again"),
    ("stop it first (stop_run / vapo-mcp runs stop)", "stop it first (stop_run / vapo-mcp runs stop)"),
    ("see logs/run_status.txt", "see logs/run_status.txt"),
])
def test_tool_calls_become_commands(text, cli):
    assert for_cli(text, run_id="r-9") == cli


def test_diagnose_needs_the_run_folder():
    assert for_cli("diagnose_error(run_id='r')") == "diagnose_error(run_id='r')"
    assert for_cli("diagnose_error(run_id='r')", run_dir="/x/r") == "vapo-mcp diagnose --log /x/r/worker.log"
