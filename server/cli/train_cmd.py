"""`vapo-mcp train`: validate, create a run directory and train in the foreground with progress lines.

The worker is the same process the MCP `start_training` tool runs detached (`python -m vapo_engine.trainer`);
this command runs it in the foreground and prints its summary. `--resume RUN_ID` continues a run from its
newest complete checkpoint.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vapo_engine.config import load_config, load_settings, preset_names, resolve_channel
from vapo_engine.runs import create_run, find_run, freeze_paths, runs_root

from .common import UserError, add_file_options, dotenv_for, print_json


def register(sub) -> None:
    p = sub.add_parser("train", help="train with VAPO in the foreground (built-in tiny model by default)")
    add_file_options(p)
    p.add_argument("--preset", help=f"a built-in preset ({', '.join(preset_names())}) or a .toml of overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--resume", metavar="RUN_ID", help="continue this run from its newest checkpoint")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    settings = load_settings(args.settings)
    root = runs_root(settings, args.settings)
    if args.resume:
        run_dir = find_run(root, args.resume)
        if run_dir is None:
            raise UserError(f"no run {args.resume!r} under {root}; list runs with `ls {root}/*/`")
        return _train(run_dir, resume=True, as_json=args.json)
    config = freeze_paths(load_config(args.config, args.set, preset=args.preset), Path(args.config).parent)
    _check_data(config)
    channel, _ = resolve_channel(settings, config, dotenv_path=dotenv_for(args.settings))
    info = create_run(config, settings, root, channel_public=channel.public(), overrides=args.set,
                      preset=args.preset)
    print(f"run {info.run_id}: {info.run_dir}", flush=True)
    return _train(info.run_dir, resume=False, as_json=args.json)


def _check_data(config) -> None:
    """Load the training and held-out sets now, so a bad dataset fails before a run directory exists."""
    from vapo_engine.tasks import TaskError, get_task
    for spec in (config.data.train, config.eval.benchmark):
        try:
            get_task(spec, config.data.data_dir)
        except TaskError as e:
            raise UserError(str(e)) from None


def _train(run_dir: Path, *, resume: bool, as_json: bool) -> int:
    """Run the worker in the foreground (same process group: Ctrl-C asks it for a graceful stop)."""
    from vapo_engine.jobs.runner import worker_command
    rc = subprocess.call(worker_command(run_dir, resume))
    summary_path = run_dir / "summary.json"
    if rc != 0 or not summary_path.is_file():
        return rc or 1
    summary = json.loads(summary_path.read_text())
    if as_json:
        print_json(summary)
        return 0
    s, f = summary["start_eval"], summary["final_eval"]
    print(f"\n{summary['status']}: {summary['steps']} policy steps in {summary['seconds']:.0f}s")
    for name in ("eval/greedy_accuracy", "eval/sampled_accuracy"):
        if name in f:
            a, b = s.get(name), f[name]
            print(f"  {name:22} {a if a is None else f'{a:.3f}'} → {b:.3f}"
                  + (f"  ({(b - a) * 100:+.1f} points)" if a is not None else ""))
    print(f"  run dir: {run_dir}")
    return 0
