#!/usr/bin/env bash
# The commands behind docs/results/split_h200.md (one H200; target rank and draft rank share
# the GPU, so the transport is gloo through host memory). Needs the SmolLM2 target cached
# (splitserve.assets) and the chitchat training JSONL; OUT receives the results.
#
#   OUT=results bash bench/split_h200.sh path/to/chitchat/train.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?chitchat train.jsonl}
OUT=${OUT:-results}
mkdir -p "$OUT"
RUN="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
# Raw copy bandwidths and the channel alone, 8K-token records.
$RUN bench/split_gpu.py copy --tokens 8192 --out "$OUT/copy.json"
# Real conversations joined into 48 rows of 8K tokens.
python3 bench/split_gpu.py long-data --src "$SRC" --out /tmp/long.jsonl --tokens 8192 --rows 48
# 5-layer draft, 512 anchors per sequence (the reference's count); then a cheaper draft.
$RUN bench/split_gpu.py train --data /tmp/long.jsonl --out "$OUT/run_a5" --minutes 1.5 --layers 5 --anchors 512
$RUN bench/split_gpu.py train --data /tmp/long.jsonl --out "$OUT/run_b2" --minutes 1.5 --layers 2 --anchors 128
