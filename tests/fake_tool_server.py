"""A real MCP tool server (stdio, the SDK's MCPServer) with faults on purpose, for tests of a run's tools:

    python tests/fake_tool_server.py MODE [MARKER]

One tool, `lookup(query)`, answering "<query>=42", except per MODE: ok (always answers); hang (never answers, the
server stays up and answers other requests); crash (the process exits during a call whose query is "crash";
with a MARKER file path, only the first such call of all the server's lives, which creates the file); big
(answers 10 MB); badjson (writes a line that is not JSON-RPC on stdout, then never answers that call; answers
the next ones); slow_start (sleeps 30 s before serving).
"""
from __future__ import annotations

import os
import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
server = MCPServer("fake-tools")
calls = {"n": 0}


@server.tool(name="lookup", structured_output=False)
async def lookup(query: str) -> str:
    """Look something up (a fake)."""
    calls["n"] += 1
    if MODE == "hang" or (MODE == "badjson" and calls["n"] == 1):
        if MODE == "badjson":
            os.write(1, b"{this is not json\n")
        await anyio.sleep(3600)
    if MODE == "crash" and query == "crash":
        marker = sys.argv[2] if len(sys.argv) > 2 else None
        if marker is None or not os.path.exists(marker):
            if marker is not None:
                os.close(os.open(marker, os.O_CREAT | os.O_WRONLY))
            os._exit(3)
    if MODE == "big":
        return "x" * 10_000_000
    return f"{query}=42"


if __name__ == "__main__":
    if MODE == "slow_start":
        time.sleep(30)
    server.run("stdio")
