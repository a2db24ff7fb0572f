#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
PY=${PYTHON:-python3}
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
