"""Worker entry point: `python -m vapo_engine.trainer RUN_DIR [--resume]`.

Trains the run whose frozen config is in RUN_DIR. SIGTERM/SIGINT ask for a graceful stop (checkpoint, then
exit 0 with summary status "stopped"). Exit codes: 0 done or stopped, 2 bad input (message on stderr, no
traceback), 1 a crash (traceback on stderr, which the run manager keeps in the run's log).

Rank 0 — the one process that writes the run directory — holds the directory's writer lock for its whole life
(`RunDir.acquire_writer`), so no second trainer can write the same run, and the run manager can tell a live
worker from a dead one even when the worker's supervisor is gone. Rank 0 prints its messages and, through the
`console` metric sink (config.toml's `logging.sinks`), one progress line per metrics record.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vapo_engine.trainer")
    ap.add_argument("run_dir")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    args = ap.parse_args(argv)
    stop = {"flag": False}

    def _ask_stop(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _ask_stop)
    signal.signal(signal.SIGINT, _ask_stop)
    from vapo_engine.errors import UserError
    from vapo_engine.rundir import RunDir

    from .loop import train
    main_rank = os.environ.get("RANK", "0") == "0"
    try:
        lock = RunDir(args.run_dir).acquire_writer() if main_rank else None  # noqa: F841 - held until exit
        summary = train(args.run_dir, resume=args.resume, should_stop=lambda: stop["flag"],
                        log=(lambda m: print(m, flush=True)) if main_rank else (lambda m: None))
    except (UserError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if main_rank:
        print(f"done: {summary['status']} after {summary['steps']} steps", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank: its work is written and closed, end it now
        from .distributed import end_rank
        end_rank(code)
    sys.exit(code)
