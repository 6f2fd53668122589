#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. Extra arguments go to pytest, after ours, so they win
# (`bash scripts/test.sh -n 0` runs it in one process).
# The tests run on pytest-xdist workers, one per core (at most 4; VAPO_TEST_WORKERS=N to choose, 0 = one process),
# one test file per worker at a time (--dist loadfile: a file's module-scoped fixtures, such as a trained run, are
# built once). Each test process uses one CPU thread (tests/conftest.py), and the tests that keep both cores busy
# (two ranks, two runs at once: marker two_processes) never run two at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cores=$(nproc 2>/dev/null || echo 1)
default=$(( cores >= 4 ? 4 : (cores >= 2 ? cores : 0) ))
workers=${VAPO_TEST_WORKERS:-$default}
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
