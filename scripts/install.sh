#!/usr/bin/env bash
# Install tokennet and what it needs into the current Python, CPU build of PyTorch first.
# (A plain `pip install torch` with nothing installed pulls a multi-GB CUDA build; on a GPU machine
#  install the torch you want first and this script keeps it.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0" 2>/dev/null \
    || "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install -q -e ".[${1:-dev}]"
