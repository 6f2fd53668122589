"""Plots of the benchmark records (matplotlib, Agg backend, imported only when a plot is drawn)."""
from __future__ import annotations

import statistics
from pathlib import Path

from tools.plots import pyplot
from tools.plots import save as save_png

from .paired import budget_curve, value_at


def save(fig, path: Path) -> None:
    """Lay out, write at 110 dpi (the resolution of the committed plots) and close a figure."""
    save_png(fig, path, dpi=110)


def plot_curves(path: Path, groups: dict[str, list[list[dict]]], title: str,
                keys: tuple[str, ...] = ("greedy", "sampled")) -> None:
    """Mean held-out accuracy per group with a min–max band across seeds, one panel per key."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        colors = plt.cm.tab20.colors if len(groups) > 10 else plt.cm.tab10.colors
        for i, (label, curves) in enumerate(groups.items()):
            _plot_group(ax, label, curves, key, colors[i % len(colors)])
        _label(ax, "policy steps", f"held-out {key} accuracy")
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _plot_group(ax, label: str, curves: list[list[dict]], key: str, color) -> None:
    steps = sorted({p["step"] for c in curves for p in c})
    rows = [[p[key] for c in curves for p in c if p["step"] == s and p[key] is not None] for s in steps]
    keep = [(s, r) for s, r in zip(steps, rows) if r]
    if not keep:
        return
    rows = [r for _, r in keep]
    mean_and_band(ax, [s for s, _ in keep], rows, label, color, ms=3, alpha=0.15, band=any(len(r) > 1 for r in rows))


def mean_and_band(ax, xs: list, rows: list[list[float]], label: str, color, ms: float, alpha: float,
                  band: bool = True) -> None:
    """The mean of each row of values against `xs`, with the min–max band of the rows."""
    ax.plot(xs, [statistics.fmean(r) for r in rows], marker="o", ms=ms, label=label, color=color)
    if band:
        ax.fill_between(xs, [min(r) for r in rows], [max(r) for r in rows], alpha=alpha, color=color)


def _label(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_budget(path: Path, runs: list[dict], variants: list[str], key: str, budget: float, title: str) -> None:
    """The paired design: mean held-out curve per row against rollouts spent (value pretraining included),
    min–max band over seeds."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = plt.cm.tab10.colors
    for i, v in enumerate(variants):
        curves = [budget_curve(r, key) for r in runs if r["variant"] == v]
        xs = sorted({x for c in curves for x, _ in c if x <= budget})
        if not xs:
            continue
        mean_and_band(ax, xs, [[value_at(c, x) for c in curves] for x in xs], v, colors[i % 10], ms=2.5, alpha=0.12)
    _label(ax, "rollouts spent (value pretraining included)", f"held-out {key} accuracy")
    ax.set_title(title, fontsize=9)
    save(fig, path)

