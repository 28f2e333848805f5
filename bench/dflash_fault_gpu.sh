#!/usr/bin/env bash
# Where does a served DFlash draft lose its acceptance on a GPU? (docs/results/families_h200.md, "Open")
# On Gemma-3-270M a DFlash draft with a 32K draft vocabulary served at τ 1.000 while DSpark drafts
# with the same vocabulary served at 6.6-8.6. This script makes the same kinds of draft on the
# embedded SmolLM2, which needs three calls of carried files instead of Gemma's six:
#   WORK/reduced  DFlash γ=16 (CE) and DSpark γ=16 (prefix), draft.draft_vocab_size=$DRAFT_VOCAB
#   WORK/full     DFlash γ=16 (CE) over the whole vocabulary (the control)
# trained together for MINUTES on chitchat, then served by `splitserve bench` (CUDA graphs, the
# default) and through bench/capture_paths.py, which serves each DFlash draft by the reference
# loop, by the engine with and without CUDA graphs, and compares its first drafted token with the
# teacher-forced one at anchors of real sequences.
# On a GPU machine whose SmolLM2 parts were stashed by bench/device_smollm2.sh (data in $DATA):
#   setsid bash bench/dflash_fault_gpu.sh all MINUTES > /dev/null 2>&1 &    # $WORK/done at the end
#   bash bench/dflash_fault_gpu.sh collect                                  # $OUT/dflash_fault.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/dflash_fault}
DATA=${DATA:-.whl/data}
DRAFT_VOCAB=${DRAFT_VOCAB:-8192}
export PYTHONUNBUFFERED=1
mkdir -p "$WORK"
[ -f "$DATA/train.jsonl" ] || gunzip -k "$DATA/train.jsonl.gz"
common=(SEEDS=0 MAX_STEPS=100000 SAVE_EVERY=100 PROMPTS=8 NEW_TOKENS=64 OUTPUT_LEN=128 DATA="$DATA")
case "${1:?all MINUTES | collect}" in
all)
    rm -f "$WORK/done"
    {
        echo "== train $(date +%T)"
        env "${common[@]}" WORK="$WORK/reduced" DRAFT_VOCAB="$DRAFT_VOCAB" \
            RUNS="dflash_b16:dflash_ce dspark_b16:prefix" bash bench/family_compare_gpu.sh train "${2:?MINUTES}" &
        a=$!
        env "${common[@]}" WORK="$WORK/full" RUNS="dflash_b16:dflash_ce" \
            bash bench/family_compare_gpu.sh train "$2" &
        b=$!
        wait "$a" || echo "reduced runs failed"
        wait "$b" || echo "full-vocabulary run failed"
        for set in reduced full; do
            echo "== bench $set $(date +%T)"
            env "${common[@]}" WORK="$WORK/$set" bash bench/family_compare_gpu.sh bench 12 || true
        done
        source bench/device_smollm2.sh env
        for run in "$WORK"/reduced/seed0/runs/*dflash* "$WORK"/full/seed0/runs/*dflash*; do
            set_name=$(basename "$(dirname "$(dirname "$(dirname "$run")")")")
            echo "== capture_paths $set_name $(basename "$run") $(date +%T)"
            python3 bench/capture_paths.py --draft "$run" --prompts "$DATA/heldout_prompts.jsonl" --num-prompts 3 \
                --new-tokens 300 --served-tokens 128 --out "$WORK/capture_${set_name}_$(basename "$run" | cut -d_ -f2).json" \
                2>&1 | grep -v "it/s\]" || echo "capture_paths failed"
        done
        echo "== done $(date +%T)"
    } >> "$WORK/all.log" 2>&1 || echo "== failed $(date +%T)" >> "$WORK/all.log"
    touch "$WORK/done"
    ;;
collect)
    # everything but the checkpoints: logs, JSON, Markdown, metrics
    (cd "$WORK" && find . -path '*/checkpoint*' -prune -o -type f \( -name '*.log' -o -name '*.json' \
        -o -name '*.jsonl' -o -name '*.md' -o -name '*.yaml' \) -print | grep -v '/train.jsonl$' \
        | tar czf "${OUT:?}/dflash_fault.tar.gz" -T -) || true
    ls -la "$OUT"
    ;;
esac
