#!/usr/bin/env bash
# The README's main job: install, train a small GPT on the embedded corpus, print metrics and a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh data
PY=${PYTHON:-python3}
exec "$PY" -m tokennet train gpt --out "${OUT:-runs/gpt}" --overwrite "$@"
