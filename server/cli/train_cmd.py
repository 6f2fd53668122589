"""`vapo-mcp train`: start a run (or resume one) and follow it in the foreground.

The run is an ordinary background job of the run manager (the same as `start_training`): registered,
queued behind a running job, supervised with a heartbeat. This command prints the worker's progress lines
as they come and the final summary; Ctrl-C asks the run to stop gracefully (checkpoint first), a second
Ctrl-C detaches (exit 130): the run goes on stopping in the background (`vapo-mcp runs status RUN_ID`).
"""
from __future__ import annotations

import time
from pathlib import Path

from tools.hints import for_cli
from tools.paths import ToolInputError, files, manager_for
from tools.training import resume_run, start_training
from vapo_engine.config import preset_names
from vapo_engine.jobs import RunError
from vapo_engine.rundir import WORKER_LOG, RunDir

from .common import UserError, add_file_options, add_trust_option, print_json, run_request_error


def register(sub) -> None:
    p = sub.add_parser("train", help="train with VAPO and follow the run (built-in tiny model by default)")
    add_file_options(p)
    p.add_argument("--preset", help=f"a built-in preset ({', '.join(preset_names())}) or a .toml of overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--tag", action="append", default=[], help="extra run tag (repeatable)")
    p.add_argument("--resume", metavar="RUN_ID", help="continue this run from its newest checkpoint, with the config it was started with (--set, "
                   "--preset and --tag are refused with it)")
    add_trust_option(p)
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.set_defaults(func=run)
    v = sub.add_parser("pretrain-value", help="value pretraining only; saves a value model that runs start from "
                       "(--set model.value_path=DIR)")
    add_file_options(v)
    v.add_argument("--preset", help=f"a built-in preset ({', '.join(preset_names())}) or a .toml of overrides")
    v.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    v.add_argument("--out", help="folder for the value model (default: <run dir>/value_model)")
    v.add_argument("--json", action="store_true", help="print the final summary as JSON")
    v.set_defaults(func=pretrain_value, tag=[], resume=None, trust_run_config=False)


def pretrain_value(args) -> int:
    """A managed run that only pretrains the value model and saves it (see trainer.critic)."""
    out = str(Path(args.out).expanduser().resolve()) if args.out else None
    return run(args, value_out=out, value_only=True)


def run(args, **mode) -> int:
    if args.resume:
        given = [flag for flag, value in (("--preset", args.preset), ("--set", args.set), ("--tag", args.tag)) if value]
        if given:
            raise UserError(f"{', '.join(given)} cannot be combined with --resume: a resumed run keeps the config "
                            f"it was started with (saved in its run dir). Fix: drop {', '.join(given)}, or start a new "
                            "run with them (vapo-mcp train without --resume)")
    f = files(args.config, args.settings)
    try:
        view = resume_run(f, args.resume, trust_run_config=args.trust_run_config) if args.resume else \
            start_training(f, preset=args.preset, overrides=args.set, tags=args.tag, **mode).run
    except (RunError, ToolInputError) as e:
        raise run_request_error(e) from None
    print(f"run {view.run_id}: {view.run_dir}", flush=True)
    mgr, _ = manager_for(f)
    rec = _follow(mgr, view.run_id, RunDir(view.run_dir).file(WORKER_LOG), quiet=args.json)
    if rec is None:  # detached (a second Ctrl-C): the run goes on in the background
        return 130
    return finish(rec, as_json=args.json)


def finish(rec, *, as_json: bool) -> int:
    """Print how the followed run ended (its message's tool calls as `vapo-mcp` commands) and return the exit
    code: 0 succeeded or stopped, 2 bad input, 1 failed."""
    summary = RunDir(rec.run_dir).summary() if rec.state.value in ("succeeded", "stopped") else {}
    message = for_cli(rec.message, run_id=rec.run_id, run_dir=rec.run_dir)  # the manager's, in tool-call words
    if as_json:
        print_json({"run_id": rec.run_id, "state": rec.state.value, "message": message, **summary})
    else:
        _print_summary(rec, message, summary)
    return 0 if rec.state.value in ("succeeded", "stopped") else 2 if rec.message.startswith("bad input") else 1


def _follow(mgr, run_id: str, log: Path, *, quiet: bool):
    """Print the worker log as it grows until the run is terminal and return its record; Ctrl-C → graceful
    stop, twice → detach (say how to follow and stop the run, return None)."""
    pos, asked_stop, waiting_said = 0, False, False
    while True:
        try:
            pos = _print_new(log, pos, quiet)
            rec = mgr.get(run_id)
            if rec.state.terminal:
                _print_new(log, pos, quiet)
                return rec
            if rec.state.value == "queued" and not waiting_said:
                print("queued: another run is using the device; waiting (Ctrl-C cancels this run)", flush=True)
                waiting_said = True
            time.sleep(0.5)
            mgr.tick()
        except KeyboardInterrupt:
            if asked_stop:
                print(detached_message(run_id), flush=True)
                return None
            print(f"\nstopping run {run_id} after a checkpoint (Ctrl-C again to detach: it goes on stopping in the "
                  "background) ...", flush=True)
            mgr.stop(run_id)
            asked_stop = True


def detached_message(run_id: str) -> str:
    """What a second Ctrl-C prints: the run was asked to stop and goes on doing so without this terminal."""
    return (f"\ndetached: run {run_id} goes on in the background (it was asked to stop after a checkpoint).\n"
            f"  follow it: vapo-mcp runs status {run_id}\n"
            f"  stop now:  vapo-mcp runs stop {run_id} --force\n"
            f"  continue:  vapo-mcp train --resume {run_id} (once it has stopped)")


def _print_new(log: Path, pos: int, quiet: bool) -> int:
    try:
        with log.open("rb") as fh:
            fh.seek(pos)
            data = fh.read()
    except OSError:
        return pos
    if data and not quiet:
        print(data.decode("utf-8", "replace"), end="", flush=True)
    return pos + len(data)


def _print_summary(rec, message: str, summary: dict) -> None:
    print(f"\n{rec.state.value}: {message}")
    if summary.get("value_path"):
        print(f"  value model: {summary['value_path']} (held-out explained variance best "
              f"{summary.get('best_heldout_explained_var')})\n  use it:      --set model.value_path=\"{summary['value_path']}\"")
    s, f = summary.get("start_eval", {}), summary.get("final_eval", {})
    for name in ("eval/greedy_accuracy", "eval/sampled_accuracy"):
        if name in f:
            a, b = s.get(name), f[name]
            print(f"  {name:22} {'–' if a is None else f'{a:.3f}'} → {b:.3f}"
                  + (f"  ({(b - a) * 100:+.1f} points)" if a is not None else ""))
    print(f"  run dir: {rec.run_dir}\n  more:    vapo-mcp report {rec.run_id}")
