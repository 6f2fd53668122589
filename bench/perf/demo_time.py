"""The README's demo as a new user runs it: a fresh clone of this repository's HEAD, an empty engine cache, then
`bash scripts/demo.sh` (setup + the default demo), timed from the command to its exit.

Recorded: the wall time in all (setup included), the seconds the run reported for its steps, the lines the demo
printed for its held-out evaluations and its summary (the README's transcript), and the load average before and
after (timings on 2 shared cores depend on it: run it with nothing else going). Only committed code is measured
(the clone takes HEAD). Setup installs from the local wheels, as `bash scripts/setup.sh` does anywhere. Not a
test: nothing here asserts.

    .venv/bin/python -m bench.perf.demo_time            # ~3 min on 2 idle cores
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from bench.lib.records import REPO, load_avg, write_record

SHOWN = ("eval   step", "value-pretrain", "train  step     2/", "succeeded:", "  eval/")
"""Prefixes of the demo's output lines kept in the record (the lines the README's transcript shows)."""


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for the record (default bench/results)")
    args = ap.parse_args(argv)
    start = load_avg()
    with tempfile.TemporaryDirectory(prefix="vapo-bench-demo-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        env = os.environ | {"VAPO_MCP_CACHE": str(Path(tmp) / "cache")}
        t0 = time.perf_counter()
        out = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, env=env, capture_output=True, text=True,
                             check=False)
        wall = time.perf_counter() - t0
    lines = out.stdout.splitlines()
    done = next((ln for ln in lines if ln.startswith("succeeded:")), "")
    run_s = re.search(r"in ([0-9.]+)s", done)
    record = {"exit_code": out.returncode, "wall_s_total": round(wall, 1),
              "run_reported_s": float(run_s.group(1)) if run_s else None,
              "printed": [ln for ln in lines if ln.startswith(SHOWN)],
              "stderr_tail": out.stderr[-2000:] if out.returncode else "",
              "load_avg_start": start, "load_avg_end": load_avg()}
    for ln in record["printed"]:
        print(ln)
    print(f"exit {out.returncode}: {wall:.0f} s in all, the run reported {record['run_reported_s']} s; "
          f"load {start} -> {record['load_avg_end']}")
    path = write_record("demo_time", record, Path(args.out) if args.out else None)
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
