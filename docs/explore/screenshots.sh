#!/usr/bin/env bash
# Re-make the explore tutorial's screenshots: train three small runs (about two minutes on 2 CPU cores), open each
# one's `tokennet explore` page in headless Chromium (Debian: apt-get install chromium), click a token, pick a head,
# ablate it, and save the page (tokennet.viz.explore.browser, the code the browser test drives the page with).
# usage: bash docs/explore/screenshots.sh [WORK_DIR]   (default: a temporary directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
t() { python -m tokennet -q train "$@" progress=false report=false --overwrite; }  # the last argument list is --set's
t vit --out "$work/vit" --max-iters 300 --set dim=32 num_layers=2 num_heads=2 eval_interval=0 svm_baseline=false
t gpt-char --out "$work/gpt-char" --max-iters 300 --set dim=64 num_layers=2 num_heads=4 block_size=64 \
    batch_size=16 eval_interval=0 sample_tokens=0
t seq2seq --out "$work/seq2seq" --max-iters 300 --set dim=64 num_layers=2 num_heads=2 eval_interval=0 \
    test_size=100 val_size=50
python -m tokennet.viz.explore.browser "$work/vit" "$work/gpt-char" "$work/seq2seq" --out "$here"
