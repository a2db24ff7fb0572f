#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
PY=${PYTHON:-python3}
# The import-direction contract ([tool.importlinter] in pyproject.toml) first: a broken one fails the script.
# Run through $PY so it checks the tokennet that $PY imports (what `lint-imports` does on PATH).
"$PY" -c 'from importlinter.cli import lint_imports_command; lint_imports_command(prog_name="lint-imports")' --no-cache
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
