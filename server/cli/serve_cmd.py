"""`vapo-mcp serve`: the MCP server over stdio (default, for coding agents) or streamable HTTP (headless).

Over HTTP the clients are remote agents: the tools read files only under the allowed roots (the project,
runtime.log_dir, the data dir and each `--allow-path DIR`; see tools.access)."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from tools.eval_gate import REQUESTS_PER_HOUR
from vapo_engine.serving.limits import BODY_TIMEOUT_S

from .common import UserError, add_file_options, port_number, positive_int


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the MCP server (stdio by default; --http for headless servers)")
    add_file_options(p)
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (non-loopback needs a token)")
    p.add_argument("--port", type=port_number, default=8765, help="HTTP port, 1..65535 (default 8765)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="extra Host header names accepted (DNS-rebinding protection), repeatable")
    p.add_argument("--allow-path", action="append", default=[], metavar="DIR",
                   help="with --http: a folder HTTP clients may name paths under, besides the project, the log "
                        "dir and the data dir; repeatable")
    p.add_argument("--body-timeout", type=positive_int(3600), default=int(BODY_TIMEOUT_S), metavar="SECONDS",
                   dest="body_timeout_s", help="with --http: seconds a client has to send its whole request body "
                   f"after the request head, else 408 and the connection is closed (default {BODY_TIMEOUT_S:g})")
    p.add_argument("--eval-requests-per-hour", type=positive_int(10_000_000), default=REQUESTS_PER_HOUR,
                   metavar="N", help="chat requests `evaluate` calls of this server may send on the API key in any "
                   f"rolling hour (default {REQUESTS_PER_HOUR}); a call that would exceed it is refused")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=serve)


def allowed_folders(paths: list[str]) -> tuple[Path, ...]:
    """The --allow-path folders, resolved; each must be an existing folder."""
    out = []
    for raw in paths:
        p = Path(raw).expanduser().resolve()
        if not p.is_dir():
            raise UserError(f"--allow-path {raw}: not an existing folder; create it or pass the right path")
        out.append(p)
    return tuple(out)


def serve(args) -> int:
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # tools resolve the files through the environment; absolute, so workers and cwd changes agree
    from tools.paths import CONFIG_ENV, SETTINGS_ENV
    os.environ[CONFIG_ENV] = str(Path(args.config).resolve())
    os.environ[SETTINGS_ENV] = str(Path(args.settings).resolve())
    from server.app import build_server
    from tools.access import Policy
    from tools.eval_gate import EvalGate
    gate = EvalGate(requests_per_hour=args.eval_requests_per_hour)
    if not args.http:
        if args.allow_path:
            logging.getLogger("vapo_mcp.serve").warning("--allow-path applies to --http only; a stdio client "
                                                        "is the local user and may name any file")
        build_server(Policy("stdio"), gate=gate).run("stdio")
        return 0
    from server.http import TOKEN_ENV, check_token, serve_http
    token = os.environ.get(TOKEN_ENV) or None
    check_token(args.host, token)
    server = build_server(Policy("http", allowed_folders(args.allow_path)), gate=gate)
    serve_http(server, host=args.host, port=args.port, token=token, allowed_hosts=args.allowed_host,
               log_level=args.log_level, body_timeout_s=float(args.body_timeout_s))
    return 0
