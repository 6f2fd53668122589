"""The `vapo-mcp` command line: one parser, one module per command group (imported lazily).

Each module in `COMMANDS` exposes `register(subparsers)` adding its subcommands; each subcommand sets
`func(args) -> int` (the exit code). User mistakes raise a `vapo_engine.errors.UserError` (ConfigError,
TaskError, RunError, the CLI's own UserError, …: the one error contract the MCP server uses too) and are
printed without a traceback, exit 2. Torch is imported only by commands that train, build or serve a model
(`build-model`, `serve-model`); `eval` runs local models in a worker process.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .common import report_error

COMMANDS = ["server.cli.config_cmd", "server.cli.train_cmd", "server.cli.serve_cmd", "server.cli.runs_cmd",
            "server.cli.channel_cmd", "server.cli.serve_model_cmd", "server.cli.eval_cmd", "server.cli.data_cmd",
            "server.cli.build_model_cmd", "server.cli.doctor_cmd", "server.cli.tool_server_cmd"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vapo-mcp", description="VAPO RL training + API-channel tools "
                                     "(MCP server, CLI).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        group = _subparsers(parser).choices.get(args.command) if args.command else None
        if group is not None:  # a command group without its subcommand (`vapo-mcp runs`): its subcommands
            group.print_help()
        else:
            parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if report_error(e):
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
