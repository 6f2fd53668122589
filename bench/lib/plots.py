"""Plots of the benchmark records (matplotlib, Agg backend, imported only when a plot is drawn)."""
from __future__ import annotations

import statistics
from pathlib import Path

from .paired import budget_curve, value_at


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> None:
    """Lay out, write (110 dpi) and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot_curves(path: Path, groups: dict[str, list[list[dict]]], title: str,
                keys: tuple[str, ...] = ("greedy", "sampled")) -> None:
    """Mean held-out accuracy per group with a min–max band across seeds, one panel per key."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        colors = plt.cm.tab20.colors if len(groups) > 10 else plt.cm.tab10.colors
        for i, (label, curves) in enumerate(groups.items()):
            _plot_group(ax, label, curves, key, colors[i % len(colors)])
        ax.set_xlabel("policy steps")
        ax.set_ylabel(f"held-out {key} accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _plot_group(ax, label: str, curves: list[list[dict]], key: str, color) -> None:
    steps = sorted({p["step"] for c in curves for p in c})
    rows = [[p[key] for c in curves for p in c if p["step"] == s and p[key] is not None] for s in steps]
    keep = [(s, r) for s, r in zip(steps, rows) if r]
    if not keep:
        return
    xs = [s for s, _ in keep]
    ax.plot(xs, [statistics.fmean(r) for _, r in keep], marker="o", ms=3, label=label, color=color)
    if any(len(r) > 1 for _, r in keep):
        ax.fill_between(xs, [min(r) for _, r in keep], [max(r) for _, r in keep], alpha=0.15, color=color)


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
        ys = [[value_at(c, x) for c in curves] for x in xs]
        ax.plot(xs, [statistics.fmean(y) for y in ys], marker="o", ms=2.5, label=v, color=colors[i % 10])
        ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.12, color=colors[i % 10])
    ax.set_xlabel("rollouts spent (value pretraining included)")
    ax.set_ylabel(f"held-out {key} accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    save(fig, path)

