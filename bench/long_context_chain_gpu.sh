#!/usr/bin/env bash
# Issue 43's remaining GPU runs in one background chain, for a session that holds a GPU machine only
# while it keeps calling (docs/results/split_h200.md, public_shape_h100.md):
#   1. the split job at 32K: real chitchat conversations joined into 32K-token rows
#      (bench/split_gpu.py long-data), then `split_gpu.py train --tokens 32768` (target rank and draft
#      rank on the one GPU, DeepSpeed ZeRO-1) for SPLIT_MINUTES, two drafts (a5, b2);
#   2. the workload draft: bench/workload_draft_gpu.sh NUM MINUTES REQUESTS (rows -> training ->
#      splitserve bench 7,000/1,024, spec against AR).
# After bench/device_smollm2.sh stash 1..3 (the call that brings part 3 also brings .whl/data and .whl/wheels):
#   bash bench/long_context_chain_gpu.sh start NUM MINUTES REQUESTS   starts the chain (setsid) and returns
#   bash bench/long_context_chain_gpu.sh wait SECONDS                 follows its log until it ends or SECONDS pass
#   bash bench/long_context_chain_gpu.sh collect                      copies the results to $OUT
# Everything lives under $ROOT (default /tmp/chain43), so later calls may replace the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-/tmp/chain43}
case "${1:?start NUM MINUTES REQUESTS | wait SECONDS | collect | run ...}" in
start)
    mkdir -p "$ROOT/data"
    cp .whl/data/heldout_prompts.jsonl .whl/data/heldout.jsonl "$ROOT/data/"
    gunzip -c .whl/data/train.jsonl.gz > "$ROOT/data/train.jsonl"
    setsid bash "$0" run "${2:?NUM}" "${3:?MINUTES}" "${4:?REQUESTS}" > "$ROOT/chain.log" 2>&1 < /dev/null &
    sleep 2
    cat "$ROOT/chain.log"
    ;;
run)
    source bench/device_smollm2.sh env
    python3 -c "import datasets" 2>/dev/null || export PYTHONPATH="$PWD/bench/shim:$PYTHONPATH"
    export PYTHONUNBUFFERED=1 DATA="$ROOT/data"
    NUM=$2 MINUTES=$3 REQUESTS=$4
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    echo "[chain] split 32K: long data $(date +%T)"
    python3 bench/split_gpu.py long-data --src "$DATA/train.jsonl" --out "$ROOT/long32k.jsonl" --tokens 32768 --rows 48
    RUN="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
    for draft in "a5 5 512" "b2 2 128"; do  # name, draft layers, anchors per sequence
        read -r name layers anchors <<< "$draft"
        echo "[chain] split 32K: draft $name $(date +%T)"
        $RUN bench/split_gpu.py train --data "$ROOT/long32k.jsonl" --out "$ROOT/split32k_$name" --tokens 32768 \
            --minutes "${SPLIT_MINUTES:-1.5}" --layers "$layers" --anchors "$anchors" > "$ROOT/split32k_$name.log" 2>&1 \
            || { tail -n 30 "$ROOT/split32k_$name.log"; echo "[chain] split 32K $name failed"; }
        tail -n 3 "$ROOT/split32k_$name.log"
    done
    echo "[chain] workload draft $(date +%T)"
    WORK="$ROOT/workload" bash bench/workload_draft_gpu.sh "$NUM" "$MINUTES" "$REQUESTS" 2>&1 \
        || echo "[chain] workload draft failed"
    echo "[chain] done $(date +%T)"
    ;;
wait)
    end=$((SECONDS + ${2:?SECONDS}))
    seen=0
    while [ $SECONDS -lt $end ]; do
        n=$(wc -l < "$ROOT/chain.log")
        [ "$n" -gt "$seen" ] && { sed -n "$((seen + 1)),${n}p" "$ROOT/chain.log"; seen=$n; }
        grep -q "^\[chain\] done" "$ROOT/chain.log" && break
        sleep 5
    done
    ;;
collect)
    out=${OUT:?OUT}
    cp "$ROOT/chain.log" "$out/" 2>/dev/null || true
    for d in "$ROOT"/split32k_*; do
        [ -f "$d/split_summary.json" ] && cp "$d/split_summary.json" "$out/$(basename "$d")_summary.json"
    done
    tar czf "$out/logs.tar.gz" -C "$ROOT" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.bin' \
        --exclude='rows.jsonl' --exclude='data' --exclude='long32k.jsonl' --exclude='global_step*' . 2>/dev/null || true
    ls -la "$out"
    ;;
esac
