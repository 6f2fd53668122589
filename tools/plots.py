"""The run plots, drawn by vapo_engine.plots (the tracker sinks draw the same plot as report_metrics)."""
from vapo_engine.plots import PANELS, plot_curves, plot_run, pyplot, save

__all__ = ["PANELS", "plot_curves", "plot_run", "pyplot", "save"]
