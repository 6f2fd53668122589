"""`python -m vapo_engine.serving DIR [options]`: serve a run directory or a model directory (no run-id
lookup here: `vapo-mcp serve-model RUN_ID` resolves ids through the run registry and calls the same `run`)."""
from __future__ import annotations

import argparse
import sys

from vapo_engine.errors import is_user_error

from .options import add_arguments, options_from


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vapo_engine.serving",
                                     description="serve a checkpoint as an OpenAI-compatible endpoint")
    add_arguments(parser, target_help="a run directory or a Hugging Face model directory")
    args = parser.parse_args(argv)
    from .server import run
    try:
        run(options_from(args, args.target))
    except Exception as e:
        if is_user_error(e):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
