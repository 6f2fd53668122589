"""The README's test command as CI runs it: a fresh clone of HEAD, empty caches, `bash .ci/run`, timed from the
command to its exit; with --ref COMMIT, the same for that commit right after, on the same machine.

Why a reference: the suite's time on 2 cores is mostly CPU, and most of its processes import torch and
transformers first (seconds each), so the same tests take twice as long on a host half as fast. A bound such as
"CI ≤ 8 minutes" only means something next to the host's speed, so the record keeps two measures of it taken
before and after the suites: the fp32 matmul peak on 2 threads and the seconds `import vapo_engine.trainer.loop`
takes in a fresh interpreter (median of 3). Timing a reference commit in the same session answers what the
current suite costs against an older one on the same host, which neither measure alone does.

Recorded per suite: the commit, the exit code, the wall time in all (setup included), pytest's own seconds and its
counts (passed, failed, skipped), the load average before and after. Run it with nothing else going: the load
average is recorded, and anything else on the 2 cores adds to every figure. Only committed code is measured.

    .venv/bin/python -m bench.perf.suite_time                   # ~15 min on 2 idle cores
    .venv/bin/python -m bench.perf.suite_time --ref ce800dc     # then that commit's suite (~12 min more)
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.records import REPO, load_avg, write_record

IMPORT = "import vapo_engine.trainer.loop"
"""What a trainer process imports before its first step (torch, transformers and the engine)."""
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")


def pytest_summary(text: str) -> dict:
    """pytest's last summary line (`=== 1274 passed, 1 skipped, 2 warnings in 780.12s (0:13:00) ===`, or the same
    without the `=` under -q) as {"pytest_s": 780.12, "passed": 1274, "skipped": 1, "failed": 0, "errors": 0};
    {} where there is none."""
    for line in reversed(text.splitlines()):
        took = re.search(r" in ([0-9.]+)s\b", line)
        found = COUNTS.findall(line)
        if took and found:
            counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
            for n, word in found:
                key = "errors" if word.startswith("error") else word
                counts[key] = counts.get(key, 0) + int(n)
            return {"pytest_s": float(took.group(1)), **counts}
    return {}


def host_speed(python: str) -> dict:
    """The host's speed as this suite feels it: matmul peak (2 threads) and a trainer's import time."""
    probe = ("import time, torch\n"
             "torch.set_num_threads(2)\n"
             "from bench.perf.throughput import _time_matmul\n"
             "best = 0.0\n"
             "for n in (512, 1024, 2048):\n"
             "    a, b = torch.randn(n, n), torch.randn(n, n)\n"
             "    best = max(best, 2 * n ** 3 / _time_matmul(a, b, 1.0) / 1e9)\n"
             "print(round(best, 1))\n")
    gflops = float(subprocess.run([python, "-c", probe], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.split()[-1])
    imports = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([python, "-c", IMPORT], cwd=REPO, check=True)
        imports.append(round(time.perf_counter() - t0, 2))
    return {"matmul_fp32_gflops_2_threads": gflops, "trainer_import_s": statistics.median(imports),
            "trainer_import_s_runs": imports}


def run_suite(commit: str, tmp: Path) -> dict:
    """`bash .ci/run` in a fresh clone of `commit` with empty uv and engine caches."""
    clone = tmp / f"clone-{commit[:12]}"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    env = os.environ | {"VAPO_MCP_CACHE": str(tmp / f"cache-{commit[:12]}"), "UV_CACHE_DIR": str(tmp / "uv")}
    start = load_avg()
    t0 = time.perf_counter()
    out = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    text = out.stdout + out.stderr
    return {"commit": commit, "exit_code": out.returncode, "wall_s_total": round(wall, 1), **pytest_summary(text),
            "load_avg_start": start, "load_avg_end": load_avg(),
            "output_tail": text[-1500:] if out.returncode else ""}


def resolve(commit: str) -> str:
    got = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    if got.returncode != 0:
        raise SystemExit(f"--ref {commit!r}: not a commit of this repository (git rev-parse: "
                         f"{got.stderr.strip()}); name one from `git log --oneline`")
    return got.stdout.strip()


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default=None, help="a commit whose suite runs right after HEAD's, on the same machine")
    ap.add_argument("--out", default=None, help="folder for the record (default bench/results)")
    args = ap.parse_args(argv)
    commits = [resolve("HEAD"), *([resolve(args.ref)] if args.ref else [])]
    start, t0 = load_avg(), time.perf_counter()
    before = host_speed(sys.executable)
    with tempfile.TemporaryDirectory(prefix="vapo-bench-suite-") as tmp:
        suites = []
        for commit in commits:
            s = run_suite(commit, Path(tmp))
            suites.append(s)
            print(f"{commit[:12]}: exit {s['exit_code']}, {s['wall_s_total']:.0f} s in all, pytest "
                  f"{s.get('pytest_s')} s ({s.get('passed')} passed, {s.get('failed')} failed, {s.get('skipped')} "
                  f"skipped); load {s['load_avg_start']} -> {s['load_avg_end']}", flush=True)
    after = host_speed(sys.executable)
    print(f"host: matmul {before['matmul_fp32_gflops_2_threads']} / {after['matmul_fp32_gflops_2_threads']} "
          f"GFLOP/s, trainer import {before['trainer_import_s']} / {after['trainer_import_s']} s (before / after)")
    record = {"config": {"ref": args.ref, "workers": os.environ.get("VAPO_TEST_WORKERS", "default")},
              "suites": suites, "host_before": before, "host_after": after,
              "wall_s_total": round(time.perf_counter() - t0, 1), "load_avg_start": start, "load_avg_end": load_avg()}
    path = write_record("suite_time", record, Path(args.out) if args.out else None)
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
