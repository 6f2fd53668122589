#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the built-in defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vapo-mcp train --preset cpu-demo "$@"
