#!/usr/bin/env bash
# The draft-family comparison on one GPU (docs/results/families_h200.md): DSpark γ=8 and γ=16,
# DFlash on cross-entropy alone, and EAGLE-3, trained on the same data for the same steps
# (hence the same target tokens), two seeds, then held-out τ on chitchat, HumanEval and
# MT-Bench prompts at T=0 and T=1, and `splitserve bench` for each family against the engine's AR.
# The runs are bench/ablation_gpu.py's (one process each, all sharing the GPU); the table and
# plot are made afterwards, on any machine, by bench/family_compare.py.
# On a GPU machine whose SmolLM2 parts were stashed by bench/device_smollm2.sh, with the chitchat
# train.jsonl / heldout_prompts.jsonl in $DATA (see bench/public_shape_gpu.sh):
#   bash bench/family_compare_gpu.sh gen ROWS         (another target) regenerate the first reply of ROWS
#                                                     training rows with $TARGET itself, greedy, into $WORK/train.jsonl
#                                                     (GEN_NEW_TOKENS, GEN_BATCHING, GEN_SECONDS: see the gen case)
#   bash bench/family_compare_gpu.sh train MINUTES    both seeds' runs at once, every run MINUTES of wall time
#                                                     (or MAX_STEPS steps, whichever comes first)
#   bash bench/family_compare_gpu.sh eval             both seeds at the step every run of both reached
#   bash bench/family_compare_gpu.sh bench REQUESTS   each family's seed-0 draft, REQUESTS held-out prompts, --baseline
#   bash bench/family_compare_gpu.sh all ROWS MINUTES REQUESTS   gen (ROWS > 0), train, eval and bench in one go,
#                                                     progress in $WORK/all.log, $WORK/done at the end: start it with
#                                                     setsid so that it outlives one call, and wait on it from the next
#   bash bench/family_compare_gpu.sh collect          $OUT/results.tar.gz (every seed's sweep and the bench JSONs, the
#                                                     layout bench/family_compare.py reads), $OUT/logs.tar.gz and
#                                                     $OUT/regenerated.jsonl.gz (gen's rows, to skip gen next time)
#   bash bench/family_compare_gpu.sh public REQUESTS  the public serving shape (random prompts, 7,000 in + 1,024 out,
#                                                     SmolLM2's 8K context) for $PUBLIC_RUN's seed-0 draft, --baseline
# Work lives in $WORK (default /tmp/families); what the table needs is copied to $OUT when it is set.
# TARGET (default smollm2-135m) is a conf/target option; for gemma3-270m, source bench/device_gemma3.sh env first.
# DRAFT_VOCAB=N trains the DSpark and DFlash runs with draft.draft_vocab_size=N (use its own WORK).
# LOSS_CHUNK_ROWS=N bounds the loss's logits to N rows at a time (train.loss_chunk_rows). Gemma-3-270M
# needs it: with its 262K vocabulary, eight runs sharing one H200 ran out of memory without it.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
WORK=${WORK:-/tmp/families}
DATA=${DATA:-.whl/data}
RUNS=${RUNS:-"dspark_b8:prefix dspark_b16:prefix dflash_b16:dflash_ce eagle3:ttt"}
SEEDS=${SEEDS:-"0 1"}
TARGET=${TARGET:-smollm2-135m}
TRAIN=$DATA/train.jsonl
[ -f "$WORK/train.jsonl" ] && TRAIN=$WORK/train.jsonl  # the rows `gen` regenerated with $TARGET
export PYTHONUNBUFFERED=1
mkdir -p "$WORK"
case "${1:?gen ROWS | train MINUTES | eval | bench REQUESTS | all ROWS MINUTES REQUESTS | collect | public REQUESTS}" in
gen)
    # GEN_SECONDS caps gen's wall time: the rows written by then are kept (gen appends whole rows), and
    # the log says how many. GEN_BATCHING=static suits a target whose replies all run to the cap.
    # The embedded target's one-time conversion (GGUF dequantised and written out: about 90 s for
    # Gemma-3-270M) happens first, outside the cap: counted inside it, a 150 s cap on a fresh
    # machine left Gemma's first static batch of 256 rows unfinished and gen with no rows at all.
    python3 -c "import sys; from splitserve.assets import resolve_target_path as r; r(sys.argv[1])" "$TARGET"
    rc=0
    ${GEN_SECONDS:+timeout --signal=TERM "$GEN_SECONDS"} python3 -m splitserve.cli gen --data "$DATA/train.jsonl" \
        --target "$TARGET" --out "$WORK/train.jsonl.part" --max-rows "${2:?ROWS}" --max-turns 1 \
        --max-new-tokens "${GEN_NEW_TOKENS:-256}" --batch-size 256 --batching "${GEN_BATCHING:-continuous}" \
        --device cuda --dtype bfloat16 > "$WORK/gen.log" 2>&1 || rc=$?
    if [ "$rc" = 124 ] && [ -s "$WORK/train.jsonl.part" ]; then
        echo "gen stopped after ${GEN_SECONDS} s with $(wc -l < "$WORK/train.jsonl.part") rows written: training on those" \
            | tee -a "$WORK/gen.log"
    elif [ "$rc" != 0 ]; then
        tail -n 30 "$WORK/gen.log"; exit 1
    fi
    mv "$WORK/train.jsonl.part" "$WORK/train.jsonl"
    tail -n 5 "$WORK/gen.log"
    if [ -n "${OUT:-}" ]; then cp "$WORK/gen.log" "$OUT/"; fi
    ;;
train)
    pids=()
    for seed in $SEEDS; do
        # shellcheck disable=SC2086
        python3 bench/ablation_gpu.py train --data "$TRAIN" --prompts "$DATA/heldout_prompts.jsonl" \
            --target "$TARGET" --root "$WORK/seed$seed" --seed "$seed" --runs $RUNS --minutes "${2:?MINUTES}" --max-steps "${MAX_STEPS:-100000}" --num-layers 4 ${DRAFT_VOCAB:+--draft-vocab $DRAFT_VOCAB} ${LOSS_CHUNK_ROWS:+--loss-chunk-rows $LOSS_CHUNK_ROWS} \
            --save-every "${SAVE_EVERY:-100}" --capture-graphs --num-prompts "${PROMPTS:-30}" \
            --max-new-tokens "${NEW_TOKENS:-192}" > "$WORK/train_seed$seed.log" 2>&1 &
        pids+=($!)
    done
    rc=0  # a bare `wait` returns 0 whatever the runs did: wait for each, report after the copies
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    for seed in $SEEDS; do tail -n "$(echo $RUNS | wc -w)" "$WORK/train_seed$seed.log"; done
    if [ -n "${OUT:-}" ]; then
        for seed in $SEEDS; do
            mkdir -p "$OUT/seed$seed"
            cp "$WORK/train_seed$seed.log" "$WORK/seed$seed/train_summary.json" "$OUT/seed$seed/"
        done
    fi
    exit "$rc"
    ;;
eval)
    pids=()
    # The largest checkpoint step that every run of every seed reached: one token budget for all.
    step=$(python3 -c "
import sys
from pathlib import Path
from splitserve.models.run_files import checkpoint_dirs
runs = [d for s in sys.argv[1:] for d in (Path(s) / 'runs').iterdir()]
print(max(set.intersection(*(set(checkpoint_dirs(d)) for d in runs))))" $(for s in $SEEDS; do echo "$WORK/seed$s"; done))
    echo "every run at step $step"
    for seed in $SEEDS; do
        python3 bench/ablation_gpu.py eval --root "$WORK/seed$seed" --step "$step" --engine --no-curve --no-exact \
            > "$WORK/eval_seed$seed.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    for seed in $SEEDS; do grep -E "^\| draft=|exit" "$WORK/eval_seed$seed.log" || tail -n 30 "$WORK/eval_seed$seed.log"; done
    if [ -n "${OUT:-}" ]; then
        for seed in $SEEDS; do
            mkdir -p "$OUT/seed$seed"
            cp "$WORK/eval_seed$seed.log" "$OUT/seed$seed/"
            (cd "$WORK/seed$seed" && tar czf "$OUT/seed$seed/sweep.tar.gz" sweep)  # its checkpoints hold state.json only
        done
    fi
    exit "$rc"
    ;;
bench)
    seed=$(echo $SEEDS | cut -d' ' -f1)
    mkdir -p "$WORK/bench"
    first=1
    for run in "$WORK/seed$seed"/runs/*; do
        name=$(basename "$run")
        flags=()
        [ "$first" = 1 ] && flags=(--baseline)  # the AR engine once: it does not depend on the draft
        python3 -m splitserve.cli bench --draft "$run" --device cuda --dtype bfloat16 \
            --prompts "$DATA/heldout_prompts.jsonl" --num-requests "${2:?REQUESTS}" --output-len "${OUTPUT_LEN:-256}" \
            --max-model-len 4096 --seed 0 "${flags[@]}" --result-file "$WORK/bench/$name.json" \
            > "$WORK/bench/$name.log" 2>&1 || { echo "$name failed"; tail -n 20 "$WORK/bench/$name.log"; }
        grep "^|" "$WORK/bench/$name.log" | head -n 8 || true
        first=0
    done
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/bench" && cp "$WORK"/bench/* "$OUT/bench/"; fi
    ;;
all)
    rm -f "$WORK/done"
    {
        if [ "${2:?ROWS}" -gt 0 ] && [ ! -f "$WORK/train.jsonl" ]; then
            echo "== gen $(date +%T)"; OUT="" bash "$0" gen "$2"
        fi
        echo "== train $(date +%T)"; OUT="" bash "$0" train "${3:?MINUTES}"
        echo "== eval $(date +%T)"; OUT="" bash "$0" eval
        echo "== bench $(date +%T)"; OUT="" bash "$0" bench "${4:?REQUESTS}"
        echo "== done $(date +%T)"
    } >> "$WORK/all.log" 2>&1 || echo "== failed $(date +%T)" >> "$WORK/all.log"
    touch "$WORK/done"
    ;;
collect)
    stage=$(mktemp -d)
    for seed in $SEEDS; do
        [ -d "$WORK/seed$seed/sweep" ] || continue
        mkdir -p "$stage/seed$seed"
        (cd "$WORK/seed$seed" && tar czf "$stage/seed$seed/sweep.tar.gz" sweep)
    done
    [ -d "$WORK/bench" ] && mkdir -p "$stage/bench" && cp "$WORK"/bench/*.json "$stage/bench/" 2>/dev/null || true
    tar czf "${OUT:?}/results.tar.gz" -C "$stage" .
    # the rows `gen` regenerated: carried back in as $WORK/train.jsonl, a later `all 0 ...` skips gen
    [ -f "$WORK/train.jsonl" ] && gzip -c "$WORK/train.jsonl" > "$OUT/regenerated.jsonl.gz"
    (cd "$WORK" && tar czf "$OUT/logs.tar.gz" --ignore-failed-read ./*.log seed*/train_summary.json bench/*.log 2>/dev/null) || true
    rm -rf "$stage"
    ls -la "$OUT"
    ;;
public)
    seed=$(echo $SEEDS | cut -d' ' -f1)
    run=$(ls -d "$WORK/seed$seed"/runs/*"draft=${PUBLIC_RUN:-dspark_b16},"* | head -n 1)
    mkdir -p "$WORK/public"
    python3 -m splitserve.cli bench --draft "$run" --device cuda --dtype bfloat16 --random \
        --input-len "${INPUT_LEN:-7000}" --output-len "${OUTPUT_LEN:-1024}" --num-requests "${2:?REQUESTS}" \
        --max-concurrency 1 --max-model-len 8192 --baseline --seed 0 --result-file "$WORK/public/bench.json" \
        > "$WORK/public/bench.log" 2>&1 || { tail -n 30 "$WORK/public/bench.log"; exit 1; }
    grep "^|" "$WORK/public/bench.log"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/public" && cp "$WORK"/public/* "$OUT/public/"; fi
    ;;
esac
