"""report_metrics: latest values, trends, a bounded series with a cursor, and a PNG plot — for one run, or
the comparison table of an ablation (ablation id). Plain functions; no mcp, no torch."""
from __future__ import annotations

import itertools
import statistics

from pydantic import BaseModel, Field

from vapo_engine.jobs import RunSnapshot
from vapo_engine.metrics import CATALOGUE
from vapo_engine.rundir import REPORT_PNG

from .paths import Files, ToolInputError
from .plots import plot_curves, plot_run
from .training import views_for

DEFAULT_SERIES = ("rollout/reward_mean", "rollout/response_length", "critic/explained_var",
                  "vapo/lambda_policy_mean", "actor/entropy", "actor/pg_loss")
PROVIDER_SERIES = ("provider/positives_added", "provider/accuracy", "provider/rate_limited", "provider/concurrency")
MAX_POINTS = 500


class Trend(BaseModel):
    metric: str
    verdict: str
    detail: str


class MetricsReport(BaseModel):
    run_id: str
    state: str
    step: int
    latest: dict[str, float]
    evals: list[dict[str, float]] = Field(description="every held-out evaluation (bounded)")
    trends: list[Trend]
    series: dict[str, list[list[float]]] = Field(description="[step, value] pairs per metric, from cursor")
    cursor: int
    next_cursor: int | None = Field(description="call again with cursor=next_cursor for more; None = done")
    plot_png: str | None = None


class AblationRow(BaseModel):
    variant: str
    run_id: str
    state: str
    final_greedy_accuracy: float | None
    delta_vs_full: float | None
    steps_to_threshold: int | None
    paper_aime: float | None


class AblationReport(BaseModel):
    ablation_id: str
    threshold: float
    rows: list[AblationRow]
    table_markdown: str
    plot_png: str | None = None
    done: bool


def _num(r: dict, k: str) -> float | None:
    v = r.get(k)
    return float(v) if isinstance(v, (int, float)) else None


def trends(train: list[dict], evals: list[dict]) -> list[Trend]:
    out = []
    lens = [v for r in train if (v := _num(r, "rollout/response_length")) is not None]
    if len(lens) >= 4:
        q = max(1, len(lens) // 4)
        a, b = statistics.mean(lens[:q]), statistics.mean(lens[-q:])
        verdict = "growing" if b > a * 1.05 else "shrinking" if b < a * 0.95 else "flat"
        out.append(Trend(metric="rollout/response_length", verdict=verdict, detail=f"first quarter {a:.1f} → last quarter {b:.1f} tokens"))
    rew = [v for r in train if (v := _num(r, "rollout/reward_mean")) is not None]
    if len(rew) >= 6:
        diffs = [y - x for x, y in itertools.pairwise(rew)]
        flips = sum(1 for x, y in itertools.pairwise(diffs) if x * y < 0) / max(1, len(diffs) - 1)
        sd = statistics.pstdev(rew[-max(3, len(rew) // 3):])
        verdict = "oscillating" if flips > 0.7 and sd > 0.1 else "stable"
        out.append(Trend(metric="rollout/reward_mean", verdict=verdict, detail=f"sign flips {flips:.0%}, recent std {sd:.3f}, first {rew[0]:.3f} → last {rew[-1]:.3f}"))
    ev = [v for r in train if (v := _num(r, "critic/explained_var")) is not None]
    if ev:
        recent = statistics.mean(ev[-max(1, len(ev) // 4):])
        verdict = "good" if recent > 0.5 else "weak" if recent > 0.1 else "collapsed"
        out.append(Trend(metric="critic/explained_var", verdict=verdict, detail=f"recent mean {recent:.3f}"))
    acc = [v for r in evals if (v := _num(r, "eval/greedy_accuracy")) is not None]
    if len(acc) >= 2:
        d = acc[-1] - acc[0]
        out.append(Trend(metric="eval/greedy_accuracy", verdict="improving" if d > 0.02 else "degrading" if d < -0.02 else "flat", detail=f"{acc[0]:.3f} → {acc[-1]:.3f} ({d * 100:+.1f} points)"))
    return out


def report_metrics(f: Files, run_id: str, *, names: list[str] | None = None, cursor: int = 0,
                   limit: int = 200, plot: bool = True) -> MetricsReport | AblationReport:
    if run_id.startswith("abl-"):
        return ablation_report(f, run_id, plot=plot)
    default = names is None
    names = list(names or DEFAULT_SERIES)
    bad = [n for n in names if n not in CATALOGUE]
    if bad:
        raise ToolInputError(f"unknown metric(s) {bad}; valid names: {', '.join(sorted(CATALOGUE))}")
    snap = views_for(f).get(run_id)
    train, evals = snap.history.get("train", []), snap.history.get("eval", [])
    if default and train and "provider/requests" in train[-1]:  # a run with [provider_rollouts]
        names += list(PROVIDER_SERIES)
    limit = max(1, min(limit, MAX_POINTS))
    page = train[cursor:cursor + limit]
    series = {n: [[r["step"], r[n]] for r in page if isinstance(r.get(n), (int, float))] for n in names}
    latest = {k: v for k, v in (train[-1] if train else {}).items() if isinstance(v, (int, float)) and "/" in k}
    png = plot_run(train + evals, snap.rundir.file(REPORT_PNG), f"run {run_id}") if plot and train else None
    return MetricsReport(run_id=run_id, state=snap.record.state.value, step=train[-1]["step"] if train else 0,
                         latest=latest, evals=[_eval_row(r) for r in evals[-50:]], trends=trends(train, evals),
                         series=series, cursor=cursor,
                         next_cursor=cursor + limit if cursor + limit < len(train) else None,
                         plot_png=str(png) if png else None)


def _eval_row(r: dict) -> dict[str, float]:
    return {"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}}


def ablation_report(f: Files, ablation_id: str, *, threshold: float | None = None,
                    plot: bool = True) -> AblationReport:
    from vapo_engine.variants import VARIANTS
    views = views_for(f)
    runs = views.list(group_id=ablation_id, limit=100)
    if not runs:
        raise ToolInputError(f"unknown ablation id {ablation_id!r}; ablate() returns one, and "
                             "list_runs(tag='abl-…') shows the runs of existing ablations")
    latest: dict[str, RunSnapshot] = {}
    for snap in sorted(runs, key=lambda s: s.record.created):
        latest[snap.record.variant or snap.run_id] = snap  # a resumed variant replaces its earlier attempt
    curves = {v: [(e["step"], e["eval/greedy_accuracy"]) for e in s.history.get("eval", [])
                  if isinstance(e.get("eval/greedy_accuracy"), (int, float))] for v, s in latest.items()}
    full = curves.get("vapo") or []
    thr = threshold if threshold is not None else (max(a for _, a in full) * 0.9 if full else 0.5)
    full_final = full[-1][1] if full else None
    rows = []
    for v, snap in latest.items():
        r, c = snap.record, curves[v]
        final = c[-1][1] if c and r.state.value == "succeeded" else None
        rows.append(AblationRow(variant=v, run_id=r.run_id, state=r.state.value, final_greedy_accuracy=final,
                                delta_vs_full=None if final is None or full_final is None else final - full_final,
                                steps_to_threshold=next((s for s, a in c if a >= thr), None),
                                paper_aime=VARIANTS[v].paper_aime if v in VARIANTS else None))
    png = None
    if plot and any(curves.values()):
        png = plot_curves(curves, views.manager.root / f"{ablation_id}.png", f"ablation {ablation_id}")
    return AblationReport(ablation_id=ablation_id, threshold=thr, rows=rows, table_markdown=_table(rows, thr),
                          plot_png=str(png) if png else None,
                          done=all(s.record.state.terminal for s in latest.values()))


def _table(rows: list[AblationRow], thr: float) -> str:
    fmt = (lambda x, p=3: "–" if x is None else f"{x:.{p}f}")
    lines = [f"| variant | state | final greedy acc | Δ vs VAPO | steps to {thr:.2f} | paper AIME24 (32B) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.variant} | {r.state} | {fmt(r.final_greedy_accuracy)} | "
                     f"{'–' if r.delta_vs_full is None else f'{r.delta_vs_full * 100:+.1f} pts'} | "
                     f"{r.steps_to_threshold if r.steps_to_threshold is not None else '–'} | "
                     f"{fmt(r.paper_aime, 0)} |")
    return "\n".join(lines)
