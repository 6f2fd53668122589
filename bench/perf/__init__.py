"""Performance benchmarks; each module runs as `python -m bench.perf.<name>`."""
