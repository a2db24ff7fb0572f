#!/usr/bin/env bash
# Re-make the README's report screenshots: train four small runs (a few minutes on 2 CPU cores), write their
# reports, and render each page with headless Chromium (Debian: apt-get install chromium).
# usage: bash docs/report/screenshots.sh [WORK_DIR]   (default: a temporary directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
t() { python -m tokennet -q train "$@" progress=false --overwrite; }  # the last argument list is --set's
t gpt-char --out "$work/gpt-char" --max-iters 300 --set dim=64 num_layers=2 num_heads=4 block_size=64 \
    batch_size=16 eval_interval=50 eval_iters=5 log_interval=5 sample_tokens=200
t vit --out "$work/vit" --max-iters 300 --set dim=32 num_layers=2 num_heads=2 eval_interval=50 log_interval=5
t seq2seq --out "$work/seq2seq" --max-iters 300 --set dim=64 num_layers=2 num_heads=2 eval_interval=100 \
    log_interval=5 test_size=100 val_size=50
t caption --out "$work/caption" --max-iters 300 --set dim=64 num_layers=2 num_heads=2 eval_interval=100 \
    log_interval=5 test_size=100 val_size=50
for r in gpt-char vit seq2seq caption; do
    python -m tokennet.viz.report.browser "$work/$r/report.html" "$here/$r.png" --docs
done
