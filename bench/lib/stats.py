"""Small-sample statistics for benchmark records: Welch's interval, paired t tests and Holm's correction.

With a handful of seeds per row, a Δ is only worth quoting with its uncertainty. `welch_ci(a, b)` (unpaired)
gives mean(a) − mean(b), the Welch–Satterthwaite degrees of freedom and the 95% interval; `paired` tests
differences seed by seed, and `holm` corrects a family of them; `spread` summarises one set of values. Student's t comes from the regularized
incomplete beta function (exact at fractional df; no scipy needed).
"""
from __future__ import annotations

import math
import statistics


def spread(values: list[float | None], nd: int | None = 4) -> dict:
    """mean, std (sample, 0 for one value), min, max, n of the non-missing values, rounded to `nd` decimals
    (None: not rounded)."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}

    def r(x: float) -> float:
        return x if nd is None else round(x, nd)
    return {"mean": r(statistics.fmean(v)), "std": r(statistics.stdev(v)) if len(v) > 1 else 0.0,
            "min": r(min(v)), "max": r(max(v)), "n": len(v)}


def welch_ci(a: list[float], b: list[float]) -> dict:
    """Δ = mean(a) − mean(b) with its 95% Welch CI; None fields when either side has < 2 values."""
    a, b = [float(x) for x in a if x is not None], [float(x) for x in b if x is not None]
    if len(a) < 2 or len(b) < 2:
        d = statistics.fmean(a) - statistics.fmean(b) if a and b else None
        return {"delta": d, "ci95": None, "df": None, "significant": None, "n": [len(a), len(b)]}
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return {"delta": d, "ci95": [d, d], "df": None, "significant": d != 0, "n": [len(a), len(b)]}
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1)) + (vb ** 2 / (len(b) - 1)))
    h = t_quantile(0.05, df) * se
    return {"delta": round(d, 4), "ci95": [round(d - h, 4), round(d + h, 4)], "df": round(df, 1),
            "significant": not (d - h <= 0 <= d + h), "n": [len(a), len(b)]}


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), 0 ≤ x ≤ 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with `df` degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p_two_sided: float, df: float) -> float:
    """The t > 0 with P(|T| ≥ t) = `p_two_sided` (bisection on the exact tail)."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > p_two_sided:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired(diffs: list[float]) -> dict:
    """Mean of paired differences (one per seed), its standard error, df and two-sided p-value (t test)."""
    d = [float(x) for x in diffs if x is not None]
    n = len(d)
    if n < 2:
        return {"n": n, "delta": d[0] if d else None, "se": None, "df": None, "p": None}
    mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(n)
    p = (1.0 if mean == 0 else 0.0) if se == 0 else t_two_sided_p(mean / se, n - 1)
    return {"n": n, "delta": mean, "se": se, "df": n - 1, "p": p}


def holm(tests: dict[str, dict], alpha: float = 0.05) -> dict[str, dict]:
    """Holm's step-down correction over the paired tests {name: paired(...)}: each gets its Holm-adjusted p, the
    level it is tested at (α / (m − rank), rank 0 = smallest p), the (1 − level) t interval of its Δ (an
    interval whose exclusion of 0 agrees with the step's decision), and `resolved` (rejected by Holm; a row
    after the first non-rejection is not resolved, whatever its own p)."""
    names = sorted((k for k in tests if tests[k].get("p") is not None), key=lambda k: tests[k]["p"])
    m, out, running, stopped = len(names), {}, 0.0, False
    for rank, k in enumerate(names):
        t, level = tests[k], alpha / (m - rank)
        running = max(running, min(1.0, (m - rank) * t["p"]))
        stopped = stopped or t["p"] > level
        h = t_quantile(level, t["df"]) * t["se"]
        out[k] = {**t, "p_holm": running, "level": level, "ci": [t["delta"] - h, t["delta"] + h],
                  "resolved": not stopped}
    for k, t in tests.items():
        out.setdefault(k, {**t, "p_holm": None, "level": None, "ci": None, "resolved": False})
    return out
