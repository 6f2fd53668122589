"""Errors an agent can act on: tool-argument errors in the project's language (argument, allowed values, what to
do — never pydantic's text), unknown tools and arguments refused, and one error contract (vapo_engine.errors)
for the MCP server and the CLI: user errors carry their message, anything else shows no internal text."""
from __future__ import annotations

import pytest
from mcp import Client

from tests.mcp_helpers import LEAKS, names_a_fix, text

pytestmark = pytest.mark.anyio


CASES = [  # (tool, arguments, words the message must contain)
    ("report_metrics", {"run_id": "x", "limit": 900}, ["argument 'limit' = 900", "allowed 1–500", "smaller limit"]),
    ("report_metrics", {"run_id": "x", "cursor": -3}, ["'cursor' = -3", "allowed ≥ 0", "larger cursor"]),
    ("diagnose_error", {"status": 42}, ["'status' = 42", "100–599"]),
    ("report_metrics", {}, ["argument 'run_id' is required", "call report_metrics again with run_id"]),
    ("list_runs", {"limit": "many"}, ["'limit' = 'many' has the wrong type", "expected an integer"]),
    ("list_runs", {"limit": 2.5}, ["'limit' = 2.5", "expected an integer"]),
    ("check_channel", {"probe_chat": "maybe"}, ["'probe_chat'", "expected true/false"]),
    ("diagnose_error", {"body": 5}, ["'body' = 5", "a string, an object, a list or null"]),
    ("diagnose_error", {"headers": {"Retry-After": 3}}, ["\"headers['Retry-After']\" = 3", "expected a string"]),
    ("smoke_test", {"prompt": "q" * 4001}, ["'prompt' is too long (4001 characters)", "at most 4000"]),
    ("start_training", {"overrides": ["vapo.alpha=1"] * 51}, ["'overrides' has too many items (51)", "at most 50"]),
    ("start_training", {"overrides": ["x" * 301]}, ["'overrides[0]' is too long", "at most 300"]),
    ("run_status", {"run_id": ""}, ["'run_id' is empty", "at least 1"]),
    ("list_runs", {"state": "zombie"}, ["'state' = 'zombie' is not an allowed value", "queued, running"]),
    ("ablate", {"variants": ["ppo", "nope"]}, ["'variants[1]' = 'nope'", "no_clip_higher"]),
    ("run_status", {"run_id": "../../etc"}, ["'run_id' = '../../etc' has the wrong form", "[A-Za-z0-9._-]"]),
    ("list_runs", {"limit": 5, "sort": "asc"}, ["unexpected argument(s) 'sort'", "state, experiment, tag, limit"]),
    ("no_such_tool", {}, ["unknown tool 'no_such_tool'", "check_channel"]),
]


async def test_argument_errors_name_the_argument_the_allowed_values_and_the_fix(proj):
    from server.app import build_server
    async with Client(build_server()) as c:
        for tool, args, words in CASES:
            res = await c.call_tool(tool, args)
            msg = text(res)
            assert res.is_error and names_a_fix(msg), (tool, args, msg)
            assert not any(leak in msg for leak in LEAKS), msg
            for w in words:
                assert w in msg, (w, msg)


async def test_several_bad_arguments_are_listed_together_and_pasted_keys_do_not_come_back(proj):
    from server.app import build_server
    key = "sk-proj-" + "Zq8" * 10
    async with Client(build_server()) as c:
        res = await c.call_tool("report_metrics", {"run_id": key[:20] + "/", "limit": 0, "cursor": "x"})
    msg = text(res)
    assert msg.startswith("3 invalid arguments for report_metrics") and key[:20] not in msg, msg
    assert all(f"'{a}'" in msg for a in ("run_id", "limit", "cursor"))


async def test_user_errors_reach_the_agent_and_internal_errors_do_not(proj):
    from mcp.server.mcpserver import MCPServer

    from server.errors import agent_errors
    from vapo_engine.providers import BaseURLError
    srv = MCPServer("t")

    @srv.tool()
    @agent_errors
    async def boom(kind: str) -> str:
        if kind == "url":
            raise BaseURLError("ftp://x", "bad_scheme", "unsupported scheme 'ftp'", "use https://host/v1")
        raise ValueError("internal state at /srv/secret/path is inconsistent")
    async with Client(srv) as c:
        url = await c.call_tool("boom", {"kind": "url"})
        internal = await c.call_tool("boom", {"kind": "other"})
    assert url.is_error and "use https://host/v1" in text(url)
    assert internal.is_error and "/srv/secret/path" not in text(internal)


def test_the_cli_and_the_server_share_one_error_contract(capsys):
    from server.cli.common import report_error
    from tools.diagnose import diagnose_error
    from vapo_engine.errors import is_user_error
    from vapo_engine.providers import BaseURLError
    assert report_error(BaseURLError("x", "no_scheme", "the scheme is missing", "write https://x/v1"))
    assert "write https://x/v1" in capsys.readouterr().err
    assert not report_error(ValueError("a bug"))
    with pytest.raises(Exception) as e:
        diagnose_error(headers=["no colon here"])
    assert is_user_error(e.value) and "Name: value" in str(e.value)
