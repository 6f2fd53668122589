"""Shared pieces of the benchmarks: runs, records, statistics, plots and the markdown renderers."""
