"""Benchmarks and experiments of the engine, run from the repository root as modules.

- `bench.lib` — what every benchmark shares: training runs of a variant (`runs`), records and their provenance
  (`records`), small-sample statistics (`stats`, `paired`), plots (`plots`) and the markdown renderers
  (`render`).
- `bench.experiments` — RL experiments on the built-in tasks (ablation, sample efficiency, critic, warm start,
  chain lookup, provider samples, TRL side by side).
- `bench.perf` — performance benchmarks (throughput, memory, concurrency, scrubber, run views).
- `bench.report` — docs/results.md and the README's results block, rendered from `bench/results/*.json`.

    .venv/bin/python -m bench.perf.throughput --smoke --out /tmp/x
    .venv/bin/python -m bench.report --check

Each benchmark writes `bench/results/<name>.json` with the command that produced it. Not a test: nothing here
asserts.
"""
