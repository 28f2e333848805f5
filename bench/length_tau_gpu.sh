#!/usr/bin/env bash
# Held-out τ against context length for drafts trained on rows of different lengths (issue 43,
# "acceptance against length"). One target (the embedded
# SmolLM2), one data set (chitchat's training conversations, joined in file order into rows of at
# most L tokens by data.concat_to), the same target tokens per step (TOKENS_PER_STEP = L x batch)
# and anchors per token (one per ANCHOR_EVERY tokens), the same steps: only the row length differs,
# or, for a run named LwW, the draft's sliding context window too (draft.context_window=W, trained
# and served alike).
# Then `splitserve eval --length-buckets` cuts prompts of each bucket from chitchat's held-out
# conversations and measures τ by speculative decoding against the target.
# On a GPU machine whose SmolLM2 parts were stashed by bench/device_smollm2.sh, with chitchat's
# train.jsonl(.gz), heldout.jsonl and heldout_prompts.jsonl in $DATA:
#   bash bench/length_tau_gpu.sh train STEPS         one draft per run in RUNS (default "2048 8192"), all at once
#   bash bench/length_tau_gpu.sh eval PER_BUCKET     τ per bucket (≤1K, 1K–4K, 4K–8K) for each, greedy, float32;
#                                                    the merged table and plot in $WORK/merged (and $OUT)
#   bash bench/length_tau_gpu.sh all STEPS PER_BUCKET  train, then eval (one command for the call that
#                                                    brings the last part)
# SmolLM2's context is 8,192 positions, so an 8K–32K bucket cannot be cut for it.
# LOSS_CHUNK_ROWS=N bounds the loss's vocabulary-wide tensors to N rows at a time (train.loss_chunk_rows),
# for a GPU it shares. Work lives in $WORK (default /tmp/lengths).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
WORK=${WORK:-/tmp/lengths}
DATA=${DATA:-.whl/data}
RUNS=${RUNS:-"2048 8192"}  # row length L, or LwW: L with draft.context_window=W
TOKENS_PER_STEP=${TOKENS_PER_STEP:-16384}
ANCHOR_EVERY=${ANCHOR_EVERY:-32}
export PYTHONUNBUFFERED=1
mkdir -p "$WORK"
[ -f "$DATA/train.jsonl" ] || gunzip -k "$DATA/train.jsonl.gz"
if [ "${1:-}" = all ]; then
    bash bench/length_tau_gpu.sh train "${2:?STEPS}"
    exec bash bench/length_tau_gpu.sh eval "${3:?PER_BUCKET}"
fi
case "${1:?train STEPS | eval PER_BUCKET | all STEPS PER_BUCKET}" in
train)
    pids=()
    for run in $RUNS; do
        len=${run%%w*}
        window=0
        [ "$run" = "$len" ] || window=${run#*w}
        python3 -m splitserve.cli train experiment=quickstart "run_dir=$WORK/L$run" "draft.context_window=$window" \
            target.device=cuda target.dtype=bfloat16 train.device=cuda train.precision=bf16 \
            "data.train_path=$DATA/train.jsonl" "data.heldout_prompts=$DATA/heldout_prompts.jsonl" \
            data.max_samples=null "data.max_length=$len" "data.concat_to=$len" \
            draft=dspark_b16 draft.num_layers=4 loss=prefix \
            "train.max_steps=${2:?STEPS}" train.max_minutes=null "train.batch_size=$((TOKENS_PER_STEP / len))" \
            "train.anchors_per_seq=$((len / ANCHOR_EVERY))" train.lr=1e-3 train.warmup_steps=50 \
            train.log_every=50 train.save_every=100000 "train.loss_chunk_rows=${LOSS_CHUNK_ROWS:-0}" eval.enabled=false \
            > "$WORK/train_L$run.log" 2>&1 &
        pids+=($!)
    done
    rc=0  # a bare `wait` returns 0 whatever the runs did: wait for each
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    for run in $RUNS; do echo "== L$run"; grep -E "^\[train\] (data|done)" "$WORK/train_L$run.log" | tail -n 6 \
        || tail -n 20 "$WORK/train_L$run.log"; done
    exit $rc
    ;;
eval)
    files=() names=() pids=()
    for run in $RUNS; do  # all drafts at once: each evaluation alone leaves most of the GPU idle
        len=${run%%w*}
        if [ "$run" = "$len" ]; then names+=("trained on ${len}-token rows"); else names+=("trained on ${len}-token rows, window ${run#*w}"); fi
        python3 -m splitserve.cli eval --draft "$WORK/L$run" --prompts "$DATA/heldout.jsonl" --device cuda \
            --length-buckets 1024 4096 8192 --per-bucket "${2:?PER_BUCKET}" --max-new-tokens "${NEW_TOKENS:-64}" \
            --out "$WORK/eval_L$run" > "$WORK/eval_L$run.log" 2>&1 &
        pids+=($!)
        files+=("$WORK/eval_L$run/lengths.json")
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    for run in $RUNS; do
        echo "== L$run"; grep "^|" "$WORK/eval_L$run.log" || tail -n 30 "$WORK/eval_L$run.log"
    done
    [ "$rc" = 0 ] || exit "$rc"
    python3 bench/tau_by_length.py "${files[@]}" --names "${names[@]}" --out "$WORK/merged"
    if [ -n "${OUT:-}" ]; then
        cp "$WORK"/merged/lengths.{md,json,png} "$OUT"/
        tar czf "$OUT/logs.tar.gz" -C "$WORK" $(cd "$WORK" && ls train_L*.log eval_L*.log)
    fi
    ;;
esac
