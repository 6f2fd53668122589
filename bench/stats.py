"""Small-sample statistics for benchmark records: Welch's t confidence interval of a difference of means.

With 3 seeds per row, a Δ is only worth quoting with its uncertainty. `welch_ci(a, b)` gives mean(a) − mean(b),
the Welch–Satterthwaite degrees of freedom and the 95% confidence interval; "significant" means the interval
excludes 0. The t quantiles are a table (df 1–30; 1.96 beyond), taken at the floor of the fractional df, which
is conservative. No scipy needed.
"""
from __future__ import annotations

import math
import statistics

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]
"""Two-sided 95% quantiles of Student's t for df = 1 … 30."""


def t975(df: float) -> float:
    k = max(1, math.floor(df))
    return T975[k - 1] if k <= len(T975) else 1.96


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
    h = t975(df) * se
    return {"delta": round(d, 4), "ci95": [round(d - h, 4), round(d + h, 4)], "df": round(df, 1),
            "significant": not (d - h <= 0 <= d + h), "n": [len(a), len(b)]}
