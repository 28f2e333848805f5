#!/usr/bin/env bash
# A draft trained on the benchmark's own workload, then benched on it (docs/results/public_shape_h100.md):
# the target's greedy continuations of NUM random prompts (half uniform ids, half chitchat turns
# repeated to the length, 500-7,000 tokens, 256 tokens each) -> a 4-layer γ=16 draft trained on them
# for MINUTES -> splitserve bench 7,000/1,024 on held-out random prompts (seed 0; the rows use seeds
# from 1), uniform and repeated-turn, spec against AR.
# After bench/device_smollm2.sh stash 1..3, with .whl/data (train.jsonl[.gz], heldout_prompts.jsonl):
#   setsid bash bench/workload_draft_gpu.sh NUM MINUTES REQUESTS > /tmp/workload.log 2>&1 &
# Work in $WORK (default /tmp/public_shape); results copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM=${1:?NUM rows}
MINUTES=${2:?MINUTES of training}
REQUESTS=${3:?REQUESTS per bench}
export DATA=${DATA:-.whl/data}
[ -f "$DATA/train.jsonl" ] || gunzip -k "$DATA/train.jsonl.gz"
export WORK=${WORK:-/tmp/public_shape}
echo "[workload] rows $(date +%T)"
SOURCES="uniform $DATA/train.jsonl" MIN_LEN=500 MAX_LEN=7000 CONTINUATION=256 bash bench/public_shape_gpu.sh rows "$NUM"
echo "[workload] train $(date +%T)"
TRAIN="$WORK/rows.jsonl" MAX_LENGTH=7424 BATCH=16 bash bench/public_shape_gpu.sh train "$MINUTES"
echo "[workload] bench uniform $(date +%T)"
TAG=_uniform bash bench/public_shape_gpu.sh bench "$REQUESTS"
echo "[workload] bench repeated turns $(date +%T)"
TAG=_repeated RANDOM_SOURCE="$DATA/heldout_prompts.jsonl" bash bench/public_shape_gpu.sh bench "$REQUESTS"
if [ -n "${OUT:-}" ]; then cp "$WORK/rows.log" "$OUT"/ 2>/dev/null || true; fi
echo "[workload] done $(date +%T)"
