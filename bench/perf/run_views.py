"""`list_runs` / `run_status` on a long run: milliseconds per call for a run whose metrics.jsonl holds 50,000
records (docs/security.md: parsers are bounded; both used to parse the whole file, ~0.5 s per 5,000-step run on every call; now the last
train and eval records are read from the end of the file, `vapo_engine.metrics.latest`).

Reported: the median and worst wall time of `repeats` calls each, first with the file as written (the first
call reads it, later ones hit the cache keyed by the file's size and mtime) and then while one more record is
appended before every call (no cache hit: each call reads the file's tail again), beside the time of one full
parse (`read_metrics`) for scale. No training: the run directory is made by `create_run` and the records are
written directly. Not a test: nothing here asserts.

    .venv/bin/python -m bench.perf.run_views [--records 50000] [--repeats 50] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.lib.records import REPO, load_avg, write_record


def _records(n: int) -> str:
    lines = []
    for step in range(1, n + 1):
        lines.append(json.dumps({"kind": "train", "step": step, "actor/pg_loss": 0.01 * (step % 7),
                                 "rollout/response_length": 30 + step % 11, "rollout/reward_mean": 0.5}))
        if step % 250 == 0:
            lines.append(json.dumps({"kind": "eval", "step": step, "eval/greedy_accuracy": 0.4}))
    return "\n".join(lines) + "\n"


def _ms(fn, repeats: int, before=None) -> dict:
    times = []
    for _ in range(repeats):
        if before:
            before()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000, help="train records in metrics.jsonl")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=None, help="folder for the record (default bench/results)")
    args = ap.parse_args()
    from tools.paths import Files
    from tools.training import list_runs, run_status
    from vapo_engine.config import load_config, load_settings
    from vapo_engine.jobs import Registry, State
    from vapo_engine.metrics import read_metrics
    from vapo_engine.runs import create_run
    start = load_avg()
    with tempfile.TemporaryDirectory(prefix="vapo-bench-views-") as tmp:
        logs = Path(tmp) / "logs"
        settings = json.loads((REPO / "settings.json").read_text())
        settings["runtime"]["log_dir"] = str(logs)
        (Path(tmp) / "settings.json").write_text(json.dumps(settings))
        (Path(tmp) / "config.toml").write_text((REPO / "config.toml").read_text())
        files = Files(Path(tmp) / "config.toml", Path(tmp) / "settings.json")
        reg = Registry(logs)
        run_dir = create_run(load_config(files.config), load_settings(files.settings), logs,
                             run_id="long").run_dir
        reg.add("long", "bench", [], run_dir)
        reg.claim_queued(1)
        reg.transition("long", State.SUCCEEDED, "written by bench.perf.run_views")
        metrics = run_dir / "metrics.jsonl"
        metrics.write_text(_records(args.records))
        step = [args.records]

        def append() -> None:
            step[0] += 1
            with metrics.open("a") as f:
                f.write(json.dumps({"kind": "train", "step": step[0], "actor/pg_loss": 0.0}) + "\n")

        row = {"records": args.records, "file_mb": round(metrics.stat().st_size / 1e6, 2),
               "full_parse": _ms(lambda: read_metrics(metrics), 3),
               "list_runs": _ms(lambda: list_runs(files), args.repeats),
               "run_status": _ms(lambda: run_status(files, "long"), args.repeats),
               "list_runs_growing": _ms(lambda: list_runs(files), args.repeats, append),
               "run_status_growing": _ms(lambda: run_status(files, "long"), args.repeats, append)}
        row["step_shown"] = run_status(files, "long").run.step  # the last record appended
        row["last_step"] = step[0]
    for name, value in row.items():
        print(f"{name:20} {value}")
    path = write_record("run_views", {**row, "load_avg_start": start, "load_avg_end": load_avg()},
                        Path(args.out) if args.out else None)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
