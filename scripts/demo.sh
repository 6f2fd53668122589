#!/usr/bin/env bash
# Set up (idempotent) and run the default demo: VAPO on the built-in planted-stop chain model (preset
# demo-planted-stop; the addition demo of earlier versions is `vapo-mcp train --preset cpu-demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vapo-mcp train --preset demo-planted-stop "$@"
