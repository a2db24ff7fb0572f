#!/usr/bin/env bash
# The README's main job: install, train a character GPT on Tiny Shakespeare (embedded) for 150 s, print a
# short summary (steps, validation loss, a sample, where the run directory and its report page are).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh data
PY=${PYTHON:-python3}
exec "$PY" -m tokennet train gpt-char --out "${OUT:-runs/gpt-char}" --overwrite "$@"
