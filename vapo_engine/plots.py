"""PNG plots of run metrics (matplotlib, Agg backend, imported only when a plot is drawn): report_metrics and
the tracker sinks (vapo_engine/sinks) draw the same plot of a run."""
from __future__ import annotations

import io
from pathlib import Path

from .datafiles import write_atomic

PANELS = (("rollout/reward_mean", "eval/greedy_accuracy"), ("rollout/response_length",),
          ("critic/explained_var", "critic/value_loss"), ("vapo/lambda_policy_mean", "actor/entropy"))


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, out, dpi: int = 80):
    """Lay out, write and close a figure: into `out` when it is a file object (an in-memory buffer), else to the
    path `out`, replaced atomically and never written through a planted symlink (vapo_engine.datafiles)."""
    fig.tight_layout()
    try:
        if isinstance(out, (str, Path)):
            buf = io.BytesIO()
            fig.savefig(buf, dpi=dpi, format="png")
            write_atomic(out, buf.getvalue())
        else:
            fig.savefig(out, dpi=dpi, format="png")
    finally:
        pyplot().close(fig)
    return out


def plot_run(records: list[dict], out: Path, title: str) -> Path:
    fig, axes = pyplot().subplots(2, 2, figsize=(10, 6.5))
    for ax, names in zip(axes.flat, PANELS):
        for name in names:
            pts = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))]
            if pts:
                ax.plot(*zip(*pts), marker="o" if name.startswith("eval/") else None, ms=3, label=name)
        ax.set_xlabel("policy step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save(fig, out)


def plot_curves(curves: dict[str, list[tuple[int, float]]], out: Path, title: str,
                ylabel: str = "held-out greedy accuracy") -> Path:
    fig, ax = pyplot().subplots(figsize=(8, 5))
    for name, pts in curves.items():
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, label=name)
    ax.set_xlabel("policy step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return save(fig, out)
