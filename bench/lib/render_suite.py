"""The section of the test-suite time record (bench/perf/suite_time.py) in docs/results.md (used by bench.report)."""
from __future__ import annotations

from .render import section


def _counts(s: dict) -> str:
    return ", ".join(f"{s[k]} {k}" for k in ("passed", "failed", "skipped", "errors") if s.get(k)) or "no summary"


def suite_time(rec: dict) -> str:
    lines = ["| suite (commit) | exit | tests | pytest s | in all, setup included | load average at start |",
             "|---|---|---|---|---|---|"]
    for s in rec["suites"]:
        lines.append(f"| {s['commit'][:10]} | {s['exit_code']} | {_counts(s)} | {s.get('pytest_s', '—')} | "
                     f"{s['wall_s_total']:.0f} s ({s['wall_s_total'] / 60:.1f} min) | {s['load_avg_start']} |")
    b, a = rec["host_before"], rec["host_after"]
    host = (f"The host, measured before / after the suites: fp32 matmul peak on 2 threads "
            f"{b['matmul_fp32_gflops_2_threads']} / {a['matmul_fp32_gflops_2_threads']} GFLOP/s; a fresh "
            f"interpreter's `import vapo_engine.trainer.loop` {b['trainer_import_s']} / {a['trainer_import_s']} s "
            "(median of 3). Most of the suite's processes (trainers, torchrun ranks, model servers, bench children) "
            "pay about that import before anything else, so the suite's time scales with the host's speed: compare "
            "suites only within one record. Setup is each commit's own scripts/setup.sh (installers differ between "
            "commits), so the pytest column is the one that compares suites.")
    notes = [host]
    if len(rec["suites"]) == 2 and all(s.get("pytest_s") for s in rec["suites"]):
        head, ref = rec["suites"]
        notes.append(f"On this host, HEAD's pytest took {head['pytest_s'] / ref['pytest_s']:.2f}× the time of "
                     f"{ref['commit'][:10]}'s, run right after it.")
    return section(lines, rec, *notes)
