"""The secret scrubber on megabytes of adversarial text: CPU seconds per call, and the ratio between 2 MB and
1 MB (linear ≈ 2; the quadratic patterns it replaced gave 4, and took 4 s for 24 kB of "sk-"; docs/security.md "What holds for every caller").

Each input repeats one piece that starts a credential-shaped match and then breaks it ("sk-", "key=", "a:b@",
…), so every start is a near miss. Three calls each: `scrub` without a known key, `scrub` with a known key
(its echo windows), and `redact_tokens`. Reported: CPU seconds (`time.process_time`, so other load on the
machine does not count) and the wall time. Not a test: nothing here asserts (tests/test_scrub_linear.py
checks the 1 MB bound).

    .venv/bin/python -m bench.perf.scrub [--mb 1] [--out DIR]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.lib.records import load_avg, write_record

PIECES = ("sk-", "sk_", "ak-", "r8_", "glpat-", "key=", "password=", "bearer ", "Bearer\t", "a.", "=a:", "(a:",
          "a:b@", "a://", "://", "https://a@", "api_key: ", "x-api-key: a", "hf_", "AIza-", "xoxb-", "@", "x",
          "sk-a1", "key=key=1", "1")
KEY = "sk-proj-9Qx7Lm2Pz8Rt4Vw6Yb3NcK5JaaBBcc"


def _time(fn, *args) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn(*args)
    return round(time.process_time() - c, 3), round(time.perf_counter() - w, 3)


def measure(piece: str, mb: float) -> dict:
    from vapo_engine.config.secrets import redact_tokens
    from vapo_engine.providers.redaction import scrub
    row = {"piece": piece}
    for size in (mb, 2 * mb):
        text = piece * (int(size * 1_000_000) // len(piece) + 1)
        for name, fn, args in (("scrub", scrub, (text,)), ("scrub_with_key", scrub, (text, [KEY])),
                               ("redact_tokens", redact_tokens, (text,))):
            cpu, wall = _time(fn, *args)
            row[f"{name}_{size:g}mb_cpu_s"], row[f"{name}_{size:g}mb_wall_s"] = cpu, wall
    for name in ("scrub", "scrub_with_key", "redact_tokens"):
        one = row[f"{name}_{mb:g}mb_cpu_s"]
        row[f"{name}_ratio_2x"] = round(row[f"{name}_{2 * mb:g}mb_cpu_s"] / one, 2) if one else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="input size in MB (and twice that)")
    ap.add_argument("--out", default=None, help="folder for the record (default bench/results)")
    args = ap.parse_args()
    start = load_avg()
    rows = []
    for piece in PIECES:
        rows.append(measure(piece, args.mb))
        r = rows[-1]
        print(f"{piece!r:16} scrub {r[f'scrub_{args.mb:g}mb_cpu_s']:.3f}s  with key "
              f"{r[f'scrub_with_key_{args.mb:g}mb_cpu_s']:.3f}s  redact_tokens {r[f'redact_tokens_{args.mb:g}mb_cpu_s']:.3f}s"
              f"  (2x input: x{r['scrub_ratio_2x']})", flush=True)
    worst = max(max(r[f"{n}_{args.mb:g}mb_cpu_s"] for n in ("scrub", "scrub_with_key", "redact_tokens"))
                for r in rows)
    path = write_record("scrub", {"mb": args.mb, "rows": rows, f"worst_cpu_s_{args.mb:g}mb": worst,
                                  "load_avg_start": start, "load_avg_end": load_avg()},
                        Path(args.out) if args.out else None)
    print(f"worst {worst:.3f} CPU s per {args.mb:g} MB call; record: {path}")


if __name__ == "__main__":
    main()
