"""RL experiments on the built-in tasks; each module runs as `python -m bench.experiments.<name>`."""
