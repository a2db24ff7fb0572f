#!/usr/bin/env bash
# Install tokennet and what it needs into the current Python, CPU build of PyTorch first:
#   bash scripts/install.sh [EXTRA]   tokennet with the optional dependencies EXTRA (default dev)
#   bash scripts/install.sh system    what the tests drive or read (Chromium, espeak-ng, Flite, Festival, Debian's
#                                     Fashion-MNIST), from the system's packages where this user may install them
#                                     (root with apt-get);
#                                     elsewhere it says which are missing, and the tests that need them skip.
# (A plain `pip install torch` with nothing installed pulls a multi-GB CUDA build; on a GPU machine
#  install the torch you want first and this script keeps it.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

install_system() {
  local missing=()
  command -v chromium >/dev/null || missing+=(chromium)
  local tool
  for tool in espeak-ng flite festival; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)  # tokennet.data.vision_data
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || ! apt-get update -qq >/dev/null 2>&1; then
    echo "install: could not install ${missing[*]} (needs root, apt-get and its package lists); the tests that" \
      "need them will skip" >&2
    return 0
  fi
  local package  # one at a time: a package the system lacks does not keep the others out
  for package in "${missing[@]}"; do
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null 2>&1 \
      || echo "install: could not install $package; the tests that need it will skip" >&2
  done
}

if [ "${1:-dev}" = system ]; then
  install_system
  exit 0
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0" 2>/dev/null \
    || "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
# --no-build-isolation: the build sees the torch installed above, so setup.py builds the native int8 kernel now
# rather than at first use; where that cannot be (no setuptools here), an isolated build installs without it.
"$PY" -m pip install -q --no-build-isolation -e ".[${1:-dev}]" \
  || "$PY" -m pip install -q -e ".[${1:-dev}]"
