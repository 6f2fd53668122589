"""`vapo-mcp tool-server NAME`: a built-in MCP tool server (server/tool_servers/) over stdio, the way a run's
`[rollout.tools]` starts it; `--http PORT` serves it over streamable HTTP on 127.0.0.1 instead (tests, or one
server shared by several runs on this machine)."""
from __future__ import annotations

import importlib
import logging
import sys

from .common import UserError, port_number


def register(sub) -> None:
    from server.tool_servers import TOOL_SERVERS
    p = sub.add_parser("tool-server", help="run a built-in MCP tool server for a run's policy (stdio by default)")
    p.add_argument("name", help=f"which tool server: {', '.join(TOOL_SERVERS.names())}")
    p.add_argument("--http", type=port_number, default=None, metavar="PORT",
                   help="streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of stdio")
    p.set_defaults(func=run)


def run(args) -> int:
    from server.tool_servers import TOOL_SERVERS
    if args.name not in TOOL_SERVERS:
        raise UserError(f"tool-server {args.name!r}: no such built-in tool server; known: "
                        f"{', '.join(TOOL_SERVERS.names())}")
    logging.basicConfig(stream=sys.stderr, level="WARNING")
    server = importlib.import_module(TOOL_SERVERS.lookup(args.name)).build()
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    return 0
