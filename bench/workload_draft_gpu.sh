#!/usr/bin/env bash
# A draft trained on the benchmark's own workload, then benched on it (docs/results/public_shape_h100.md):
# the target's greedy continuations of NUM random prompts (half uniform ids, half chitchat turns
# repeated to the length, 500-7,000 tokens, 256 tokens each) -> a 4-layer γ=16 draft trained on them
# for MINUTES -> splitserve bench 7,000/1,024 on held-out random prompts (seed 0; the rows use seeds
# from 1), uniform and repeated-turn, spec against AR -> a probe: the same draft served on its own
# training rows' prompts, and bench/capture_paths.py on two of them.
# After bench/device_smollm2.sh stash 1..3, with .whl/data (train.jsonl[.gz], heldout_prompts.jsonl):
#   setsid bash bench/workload_draft_gpu.sh NUM MINUTES REQUESTS > /tmp/workload.log 2>&1 &
# Work in $WORK (default /tmp/public_shape); results copied to $OUT when it is set. BATCH (16) is the
# training batch: a smaller one gives more steps in the same minutes. CONTEXT_WINDOW=N trains the
# draft with draft.context_window=N, and so serves it (the window is part of the draft's arch).
# REPEATED=0 leaves out the repeated-turn bench, PROBE=0 the probe (a short GPU session). STAGES
# (default "rows train bench probe") runs only the stages named, in that order, on the same $WORK:
# a chain that shares the GPU while rows and training run can bench alone afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env  # the probe below runs splitserve itself
NUM=${1:?NUM rows}
MINUTES=${2:?MINUTES of training}
REQUESTS=${3:?REQUESTS per bench}
export DATA=${DATA:-.whl/data}
[ -f "$DATA/train.jsonl" ] || gunzip -k "$DATA/train.jsonl.gz"
export WORK=${WORK:-/tmp/public_shape}
STAGES=" ${STAGES:-rows train bench probe} "
[ "${PROBE:-1}" = 1 ] || STAGES=${STAGES/ probe / }
if [[ $STAGES == *" rows "* ]]; then
    echo "[workload] rows $(date +%T)"
    SOURCES="uniform $DATA/train.jsonl" MIN_LEN=500 MAX_LEN=7000 CONTINUATION=256 bash bench/public_shape_gpu.sh rows "$NUM"
fi
if [[ $STAGES == *" train "* ]]; then
    echo "[workload] train $(date +%T)"
    TRAIN="$WORK/rows.jsonl" MAX_LENGTH=7424 BATCH=${BATCH:-16} bash bench/public_shape_gpu.sh train "$MINUTES"
fi
if [[ $STAGES == *" bench "* ]]; then
    echo "[workload] bench uniform $(date +%T)"
    TAG=_uniform bash bench/public_shape_gpu.sh bench "$REQUESTS"
    if [ "${REPEATED:-1}" = 1 ]; then
        echo "[workload] bench repeated turns $(date +%T)"
        TAG=_repeated RANDOM_SOURCE="$DATA/heldout_prompts.jsonl" bash bench/public_shape_gpu.sh bench "$REQUESTS"
    fi
fi
[[ $STAGES == *" probe "* ]] || { echo "[workload] done $(date +%T)"; exit 0; }
echo "[workload] probe $(date +%T)"
# The training rows' own prompts (a row file serves the ids before its first trained token). A draft
# that accepts there but not on held-out prompts has learnt its rows, not the workload; one that
# accepts nowhere while its training α rose points at training and serving seeing different
# things, which capture_paths.py separates (teacher-forced against served first tokens).
python3 -m splitserve.cli bench --draft "$WORK/run" --device cuda --dtype bfloat16 --prompts "$WORK/rows.jsonl" \
    --output-len 256 --num-requests 4 --max-model-len 8192 --seed 0 --result-file "$WORK/bench_rows.json" \
    > "$WORK/bench_rows.log" 2>&1 && grep -E "accept length|acceptance by" "$WORK/bench_rows.log" \
    || { tail -n 20 "$WORK/bench_rows.log"; echo "[workload] bench on the training rows failed"; }
python3 bench/capture_paths.py --draft "$WORK/run" --prompts "$WORK/rows.jsonl" --num-prompts 2 --new-tokens 256 \
    --served-tokens 128 --device cuda --dtype bfloat16 --out "$WORK/capture_paths.json" > "$WORK/capture_paths.log" 2>&1 \
    && grep -E "first draft token|engine drafter" "$WORK/capture_paths.log" \
    || { tail -n 20 "$WORK/capture_paths.log"; echo "[workload] capture_paths failed"; }
if [ -n "${OUT:-}" ]; then cp "$WORK/rows.log" "$WORK/capture_paths.json" "$WORK/bench_rows.json" "$OUT"/ 2>/dev/null || true; fi
echo "[workload] done $(date +%T)"
