"""`vapo-mcp serve`: the MCP server over stdio (default, for coding agents) or streamable HTTP (headless)."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from .common import UserError, add_file_options


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the MCP server (stdio by default; --http for headless servers)")
    add_file_options(p)
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (non-loopback needs a token)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="extra Host header names accepted (DNS-rebinding protection), repeatable")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=serve)


def serve(args) -> int:
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # tools resolve the files through the environment; absolute, so workers and cwd changes agree
    from tools.paths import CONFIG_ENV, SETTINGS_ENV
    os.environ[CONFIG_ENV] = str(Path(args.config).resolve())
    os.environ[SETTINGS_ENV] = str(Path(args.settings).resolve())
    from server.app import build_server
    server = build_server()
    if not args.http:
        server.run("stdio")
        return 0
    from server.http import TOKEN_ENV, serve_http
    try:
        serve_http(server, host=args.host, port=args.port, token=os.environ.get(TOKEN_ENV) or None,
                   allowed_hosts=args.allowed_host, log_level=args.log_level)
    except PermissionError as e:
        raise UserError(str(e)) from None
    return 0
