"""Paired comparisons of ablation rows over a common sample budget (the `--budget` design of
bench/experiments/ablation.py).

Every row of one seed sees the same policy-step prompts (trainer/streams.py) and spends the same number of
rollouts, value-pretraining rollouts included: a row that pretrains its critic for P rounds (one rollout each)
has P rollouts fewer for policy steps, and its held-out curve is flat at the starting accuracy over those P
rollouts (the policy does not change while the critic pretrains). Per run:

- `area`: the area under the held-out accuracy curve over rollouts 0 … budget, divided by the budget (the mean
  accuracy over the budget; trapezoids between evaluations) — one number for the whole curve instead of one
  noisy final point;
- `reach`: the rollouts spent when an evaluation first reached the threshold (None = not within the budget).

Rows are compared with VAPO seed by seed (paired differences, t test), Holm-corrected over the rows
(`stats.holm`). Torch-free; nothing here trains.
"""
from __future__ import annotations

import itertools
import statistics

from .stats import holm, paired


def budget_curve(run: dict, key: str) -> list[tuple[float, float]]:
    """[(rollouts spent, accuracy)] of a run's evaluations, with the flat stretch of its value pretraining."""
    p, upr = run.get("pretrain_rollouts", 0), run.get("updates_per_rollout", 1)
    pts = [(p + c["step"] / upr, c[key]) for c in run["curve"] if c.get(key) is not None]
    if pts and p > 0:
        pts.insert(0, (0.0, pts[0][1]))
    return pts


def area(pts: list[tuple[float, float]], budget: float) -> float | None:
    """Mean accuracy over rollouts 0 … budget (trapezoids; the last value is held to the budget)."""
    if not pts or budget <= 0:
        return None
    total, (x0, y0) = 0.0, pts[0]
    for x1, y1 in pts[1:]:
        x1c = min(x1, budget)
        if x1c > x0:
            y1c = y0 + (y1 - y0) * (x1c - x0) / (x1 - x0)
            total += (y0 + y1c) / 2 * (x1c - x0)
        x0, y0 = x1c if x1 > budget else x1, y1
        if x1 >= budget:
            break
    if x0 < budget:
        total += y0 * (budget - x0)
    return total / budget


def reach(pts: list[tuple[float, float]], threshold: float) -> float | None:
    """Rollouts spent at the first evaluation at or above `threshold` (None = never)."""
    return next((x for x, y in pts if y >= threshold), None)


def per_run(run: dict, key: str, budget: float, threshold: float) -> dict:
    pts = budget_curve(run, key)
    return {"area": area(pts, budget), "reach": reach(pts, threshold), "final": pts[-1][1] if pts else None}


def compare(runs: list[dict], variants: list[str], key: str, budget: float, threshold: float,
            base: str = "vapo") -> list[dict]:
    """One row per variant: per-seed area / reach / final, and (not for `base`) the paired difference of the
    area vs `base` with its Holm-corrected test and interval."""
    stats_of = {(r["variant"], r["seed"]): per_run(r, key, budget, threshold) for r in runs}
    seeds = sorted({s for _, s in stats_of})
    rows, tests = [], {}
    for v in variants:
        mine = {s: stats_of[v, s] for s in seeds if (v, s) in stats_of}
        areas = [m["area"] for m in mine.values() if m["area"] is not None]
        row = {"variant": v, "seeds": sorted(mine), "area": {s: m["area"] for s, m in mine.items()},
               "reach": {s: m["reach"] for s, m in mine.items()}, "final": {s: m["final"] for s, m in mine.items()},
               "area_mean": statistics.fmean(areas) if areas else None,
               "area_sd": statistics.stdev(areas) if len(areas) > 1 else None,
               "reached": sum(m["reach"] is not None for m in mine.values())}
        if v != base:
            diffs = [mine[s]["area"] - stats_of[base, s]["area"] for s in mine
                     if (base, s) in stats_of and mine[s]["area"] is not None]
            tests[v] = paired(diffs)
        rows.append(row)
    corrected = holm(tests)
    for row in rows:
        row["vs_base"] = corrected.get(row["variant"])
    return rows


def value_at(pts: list[tuple[float, float]], x: float) -> float:
    """The curve's value at `x` (linear between evaluations, held after the last)."""
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1] if x >= pts[-1][0] else pts[0][1]
