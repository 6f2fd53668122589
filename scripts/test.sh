#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. Extra arguments go to pytest, after ours, so they win
# (`bash scripts/test.sh -n 0` runs it in one process).
# The tests run on VAPO_TEST_WORKERS pytest-xdist workers (default: one per usable core, at most 4; none on one
# core), one test file per worker at a time (--dist loadfile: a file's module-scoped fixtures, such as a trained
# run, are built once). Each test process uses one CPU thread (tests/conftest.py): no oversubscribed cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cores=$(nproc 2>/dev/null || echo 1)
workers=${VAPO_TEST_WORKERS:-$(( cores < 2 ? 0 : cores < 4 ? cores : 4 ))}
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
