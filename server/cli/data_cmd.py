"""`vapo-mcp data …`: the registered benchmarks (vapo_engine/tasks/benchmarks.py), fetched ahead of time.

    vapo-mcp data list [--data-dir DIR]                   names, sources, and which are already in DIR
    vapo-mcp data fetch aime_2024 [math500 …] [--data-dir DIR] [--force]

A run fetches a missing registered benchmark by itself when its config is validated; `data fetch` does the
same up front (on a login node with network, say, before training on an offline compute node). The data
folder is `--data-dir`, else config.toml's `data.data_dir` (relative to config.toml's folder), else ./data.
Errors (offline, unreachable Hub - known within 3 s, see vapo_engine/tasks/reachability.py -, HTTP 404, a
malformed source, pyarrow missing) print one line per benchmark with the fix, without a traceback or the Hub
library's retry lines; the other names are still fetched; exit 2 when any failed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tools.paths import CONFIG_ENV
from vapo_engine.tasks import BENCHMARKS, TaskError, benchmark_names, fetch_benchmark, load_jsonl

from .common import UserError, add_json_option, print_json


def register(sub) -> None:
    data = sub.add_parser("data", help="registered benchmarks (aime_2024, math500, …): list and fetch them")
    dsub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    lst = dsub.add_parser("list", help="the registered benchmark names, their sources, and which are present")
    fetch = dsub.add_parser("fetch", help="download and convert benchmarks into <data_dir>/<name>.jsonl")
    fetch.add_argument("names", nargs="+", metavar="NAME", help=f"one of {', '.join(benchmark_names())}")
    fetch.add_argument("--force", action="store_true",
                       help="download and convert again even if the file exists")
    for p in (lst, fetch):
        p.add_argument("--data-dir", help="where <name>.jsonl goes (default: config.toml's data.data_dir)")
        p.add_argument("--config", default=os.environ.get(CONFIG_ENV, "config.toml"),
                       help=f"config.toml that gives the default data dir (default: ${CONFIG_ENV}, then "
                       "./config.toml)")
        add_json_option(p)
    lst.set_defaults(func=_list)
    fetch.set_defaults(func=_fetch)
    data.set_defaults(func=lambda args: data.print_help() or 2)


def data_dir_for(args) -> Path:
    """--data-dir, else config.toml's data.data_dir made absolute the way a run freezes it, else ./data; a path
    that exists but is not a folder is a user error."""
    folder, where = _data_dir(args)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{where} {folder}: not a folder (it is a file). Fix: pass the folder that holds (or will "
                        "hold) <name>.jsonl, e.g. --data-dir data")
    return folder


def _data_dir(args) -> tuple[Path, str]:
    if args.data_dir:
        return Path(args.data_dir).expanduser().absolute(), "--data-dir"
    config = Path(args.config)
    if not config.is_file():
        return Path("data").absolute(), "data dir"
    from vapo_engine.config import load_config
    from vapo_engine.config.path_fields import freeze_paths
    return Path(freeze_paths(load_config(config), config.resolve().parent).data.data_dir), \
        f"{config}: data.data_dir"


def _list(args) -> int:
    folder = data_dir_for(args)
    rows = [{"name": b.name, "present": (folder / f"{b.name}.jsonl").is_file(), "repo_id": b.repo_id,
             "revision": b.revision, "files": list(b.files), "split": b.split,
             "needs_pyarrow": b.needs_pyarrow, "description": b.description} for b in BENCHMARKS.values()]
    if args.json:
        print_json({"data_dir": str(folder), "benchmarks": rows})
        return 0
    print(f"data dir: {folder}")
    for r, b in zip(rows, BENCHMARKS.values()):
        state = "present" if r["present"] else "fetched on first use"
        state += " (needs pyarrow)" if b.needs_pyarrow and not r["present"] else ""
        print(f"  {b.name:12} {b.repo_id}@{b.short_revision} {', '.join(b.files)}  [{state}]")
        print(f"  {'':12} {b.description}")
    return 0


def _fetch(args) -> int:
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        raise UserError(f"unknown benchmark name(s): {', '.join(unknown)}. Fix: use one of "
                        f"{', '.join(benchmark_names())} (or put your own <data_dir>/<name>.jsonl in place).")
    folder = data_dir_for(args)
    done, failed = [], []
    for name in dict.fromkeys(args.names):
        bench = BENCHMARKS[name]
        existed = (folder / f"{name}.jsonl").is_file() and not args.force
        try:
            path = fetch_benchmark(name, folder, force=args.force)
        except TaskError as e:  # one line per benchmark that failed, with its fix; the others are still tried
            failed.append({"name": name, "error": str(e)})
            if not args.json:
                print(f"error: {name}: {e}", file=sys.stderr, flush=True)
            continue
        done.append({"name": name, "path": str(path), "problems": len(load_jsonl(path)),
                     "fetched": not existed, "source": f"{bench.repo_id}@{bench.revision}"})
        if not args.json:
            how = ("already present (--force fetches it again)" if existed
                   else f"from {bench.repo_id}@{bench.short_revision}")
            print(f"{name}: {done[-1]['problems']} problems -> {path} ({how})", flush=True)
    if args.json:
        print_json({"data_dir": str(folder), "benchmarks": done, "failed": failed})
    elif failed and done:
        print(f"{len(failed)} of {len(failed) + len(done)} benchmarks could not be fetched: "
              f"{', '.join(f['name'] for f in failed)} (each error above says how to fix it)", file=sys.stderr)
    return 2 if failed else 0
