#!/usr/bin/env bash
# The public serving workload's shape on the real SmolLM2 target: random-token prompts, one request
# at a time, greedy, EOS ignored, speculative against the engine's own AR (docs/results/public_shape_h100.md).
# SmolLM2's context is 8,192 tokens, so 7,000 input + 1,024 output stand in for 8,192 + 1,024.
# On a GPU machine whose SmolLM2 parts were stashed by bench/device_smollm2.sh (and the chitchat
# train.jsonl / heldout_prompts.jsonl in $DATA):
#   bash bench/public_shape_gpu.sh train MINUTES     the quickstart recipe on the GPU (bench/gpu_train_smollm2.py);
#                                                    TRAIN (default $DATA/train.jsonl), MAX_LENGTH (1024), BATCH (16),
#                                                    EVAL_PROMPTS (40), CONTEXT_WINDOW (0: the whole context),
#                                                    STEPS (a step cap inside the MINUTES; default none)
#   bash bench/public_shape_gpu.sh rows NUM          the target's own continuations of NUM workload-like prompts
#                                                    (bench/workload_rows.py; SOURCES, default "uniform") into
#                                                    $WORK/rows.jsonl, to train on with TRAIN=$WORK/rows.jsonl
#   bash bench/public_shape_gpu.sh bench REQUESTS    splitserve bench --random 7000/1024, --baseline, compiled;
#                                                    RANDOM_SOURCE (default uniform): --random-source, e.g. a prompt
#                                                    file whose user turns are repeated to the length (sglang's random);
#                                                    TAG names the result files (bench$TAG.json)
#   bash bench/public_shape_gpu.sh probe             the trained draft's τ by prompt kind and length (2 requests of
#                                                    256 tokens each: random 900/3000/7000, 7000 without graphs or
#                                                    with SDPA draft attention, and 6 chat prompts)
# Work lives in $WORK (default /tmp/public_shape); results are copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
WORK=${WORK:-/tmp/public_shape}
DATA=${DATA:-.whl/data}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
case "${1:?train MINUTES | rows NUM | bench REQUESTS | probe}" in
rows)
    # shellcheck disable=SC2086  # SOURCES is a list
    python3 bench/workload_rows.py --out "$WORK/rows.jsonl" --num "${2:?NUM}" --min-len "${MIN_LEN:-500}" \
        --max-len "${MAX_LEN:-7000}" --continuation "${CONTINUATION:-256}" --source ${SOURCES:-uniform} --seed 1 \
        > "$WORK/rows.log" 2>&1 || { tail -n 30 "$WORK/rows.log"; exit 1; }
    tail -n 2 "$WORK/rows.log"
    ;;
train)
    python3 bench/gpu_train_smollm2.py --train "${TRAIN:-$DATA/train.jsonl}" --prompts "$DATA/heldout_prompts.jsonl" \
        --minutes "${2:?MINUTES}" --max-steps "${STEPS:-100000}" --gamma "${GAMMA:-16}" --layers "${LAYERS:-4}" --out "$WORK/run" \
        --max-length "${MAX_LENGTH:-1024}" --batch-size "${BATCH:-16}" --eval-prompts "${EVAL_PROMPTS:-40}" \
        --context-window "${CONTEXT_WINDOW:-0}" \
        > "$WORK/train.log" 2>&1 || { tail -n 30 "$WORK/train.log"; exit 1; }
    grep -E "^\[train\] done|^\| (trained|untrained)" "$WORK/train.log" || tail -n 20 "$WORK/train.log"
    ;;
bench)
    python3 -m splitserve.cli bench --draft "$WORK/run" --device cuda --dtype bfloat16 --compile \
        --random --random-source "${RANDOM_SOURCE:-uniform}" --input-len "${INPUT_LEN:-7000}" --output-len "${OUTPUT_LEN:-1024}" --num-requests "${2:?REQUESTS}" \
        --max-concurrency 1 --max-model-len 8192 --baseline --seed 0 --result-file "$WORK/bench${TAG:-}.json" \
        > "$WORK/bench${TAG:-}.log" 2>&1 || { tail -n 30 "$WORK/bench${TAG:-}.log"; exit 1; }
    grep "^|" "$WORK/bench${TAG:-}.log"
    if [ -n "${OUT:-}" ]; then
        cp "$WORK/bench${TAG:-}.json" "$WORK/bench${TAG:-}.md" "$WORK/train.log" "$OUT"/ 2>/dev/null || true
    fi
    ;;
probe)
    run() {  # NAME, then splitserve bench arguments
        local name=$1; shift
        echo "== $name"
        python3 -m splitserve.cli bench --draft "$WORK/run" --device cuda --dtype bfloat16 --max-model-len 8192 \
            --seed 0 --result-file "$WORK/b_$name.json" "$@" 2>&1 | grep -E "accept length|acceptance by|mean TPOT" || true
    }
    for len in 7000 900 3000; do run "${len}_kernel" --random --input-len $len --output-len 256 --num-requests 2; done
    run 7000_sdpa --random --input-len 7000 --output-len 256 --num-requests 2 --draft-attention sdpa
    run 7000_eager --random --input-len 7000 --output-len 128 --num-requests 2 --no-cuda-graphs
    run chat --prompts "$DATA/heldout_prompts.jsonl" --output-len 128 --num-requests 6
    if [ -n "${OUT:-}" ]; then cp "$WORK"/b_*.json "$OUT"/ 2>/dev/null || true; fi
    ;;
esac
