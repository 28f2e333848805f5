#!/usr/bin/env bash
# Issue 43's remaining GPU runs in one background chain, for a session that holds a GPU machine only
# while it keeps calling (docs/results/split_h200.md, public_shape_h100.md):
#   1. the split job at 32K: real chitchat conversations joined into 32K-token rows
#      (bench/split_gpu.py long-data), then `split_gpu.py train --tokens 32768` (target rank and draft
#      rank on the one GPU, DeepSpeed ZeRO-1) for SPLIT_MINUTES, two drafts (a5, b2);
#   2. the workload draft: bench/workload_draft_gpu.sh NUM MINUTES REQUESTS (rows -> training ->
#      splitserve bench 7,000/1,024, spec against AR).
# After bench/device_smollm2.sh stash 1..3, or stash .whl/h1 and .whl/h2 (halves: where the checkout sent along is under 15 MB)
# (the call that brings the last part also brings .whl/data and .whl/wheels):
#   bash bench/long_context_chain_gpu.sh start NUM MINUTES REQUESTS   starts the chain (setsid) and returns;
#                                                                     SPLIT=0 leaves step 1 out
#   SHAPE=DIR LONG=FILE bash bench/long_context_chain_gpu.sh split       step 1 alone, in the foreground, on a
#                                                                     random-weight target of SmolLM2's shape
#   bash bench/long_context_chain_gpu.sh wait SECONDS                 follows its log until it ends or SECONDS pass
#   bash bench/long_context_chain_gpu.sh collect                      copies the results to $OUT
# FAMILIES=1 adds the draft-family comparison (bench/family_compare_gpu.sh, docs/results/families_h200.md)
# beside step 2, overlapped where only steps or τ are measured and alone where time is:
#   families: gen (the target's own first replies to FAMILY_ROWS chitchat rows; 0: train on .whl/data as it is)
#             -> train (every family, both seeds, FAMILY_STEPS steps) -> held-out evaluation (τ)
#   workload: rows -> training (WORKLOAD_STEPS steps, MINUTES at most)      (the two at once, except
#             that the workload's training waits for gen: gen's continuous batching keeps most of an
#             80 GB card, and a training run beside it ran out of memory)
#   then, one at a time: the workload bench (7,000/1,024), each family's bench (FAMILY_REQUESTS).
# GPU_TESTS="PYTEST ARGS" runs those tests after the workload's training, beside the families' evaluation.
# LENGTHS="STEPS PER_BUCKET" adds bench/length_tau_gpu.sh all STEPS PER_BUCKET (drafts trained on 2K- and
# 8K-token rows, held-out τ by prompt length; docs/results/lengths_gpu.md) beside the families, after
# gen and before the benches (it measures τ only); LENGTHS_CHUNK_ROWS sets its LOSS_CHUNK_ROWS.
# Issue 43's τ cost of the lighter heads on the families' target, beside the families (τ only):
#   FULL_VOCAB_RUN=1   the same block run (FULL_VOCAB_RUNS, default dspark_b16:prefix) over the whole
#                      vocabulary, same rows, seeds and steps, in $ROOT/full_vocab: against the families'
#                      DRAFT_VOCAB run with bench/paired_tau_ci.py (set FAMILY_STEPS so that every run
#                      reaches it: each evaluation takes its own runs' latest common checkpoint)
#   FP8_TAU=1          bench/draft_fp8_tau.py on the first seed's FP8_RUN (default dspark_b16) draft, after
#                      the families' evaluation: the same draft as it is and as FP8 weights, float32 target
# PATHS_CHECK=1 runs bench/capture_paths.py on the first seed's PATHS_RUN (default dflash_b16) draft after the
# evaluation: training's and serving's captures and drafted tokens, every slot for a draft without a Markov
# head, on this GPU in bf16 ($ROOT/capture_paths.json, in logs.tar.gz)
# FAMILY_TRAIN=ROWS.jsonl.gz (the regenerated.jsonl.gz an earlier `collect` returned) trains the families
# on those rows and skips gen; WORKLOAD=0 leaves the workload draft out (the families alone, e.g.
# another seed: SEEDS=1). TARGET=gemma3-270m runs the families on Gemma-3-270M (after
# bench/device_gemma3.sh stash 0..3; set LOSS_CHUNK_ROWS=1024), with WORKLOAD=0 (the workload is SmolLM2's).
# Training stops at a step count there, so sharing the GPU makes it slower, not different.
# FAMILY_MINUTES caps each family run's wall time (default 60); evaluation takes the latest checkpoint
# every run reached, so a cap keeps the token budget equal across families. FAMILY_REQUESTS=0 skips
# the families' bench (τ only). Two chains at once need two ROOTs; BENCH_AFTER=OTHER_ROOT/chain.log holds
# this chain's benches until that chain is done (BENCH_AFTER_MAX seconds at most, default 900).
# Everything lives under $ROOT (default /tmp/chain43), so later calls may replace the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-/tmp/chain43}
case "${1:?start NUM MINUTES REQUESTS | split | wait SECONDS | collect | run ...}" in
start)
    mkdir -p "$ROOT/data"
    cp .whl/data/heldout_prompts.jsonl .whl/data/heldout.jsonl "$ROOT/data/"
    gunzip -c .whl/data/train.jsonl.gz > "$ROOT/data/train.jsonl"
    if [ -n "${FAMILY_TRAIN:-}" ]; then
        mkdir -p "$ROOT/families" && gunzip -c "$FAMILY_TRAIN" > "$ROOT/families/train.jsonl"
    fi
    setsid bash "$0" run "${2:?NUM}" "${3:?MINUTES}" "${4:?REQUESTS}" > "$ROOT/chain.log" 2>&1 < /dev/null &
    sleep 2
    cat "$ROOT/chain.log"
    ;;
split)
    # The split job at 32K, in the foreground. With SHAPE=DIR (config.json and tokenizer files of
    # SmolLM2) the target is that shape with random weights (split_gpu.py shape-target), so this
    # needs no stashed GGUF; LONG=FILE.jsonl[.gz] gives the long rows, made here beforehand.
    source bench/device_smollm2.sh env
    export PYTHONUNBUFFERED=1
    mkdir -p "$ROOT"
    [ -n "${IN_CHAIN:-}" ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader  # run printed it
    target=()
    if [ -n "${SHAPE:-}" ]; then
        python3 bench/split_gpu.py shape-target --like "$SHAPE" --out "$ROOT/shape_target"
        target=(--target-path "$ROOT/shape_target")
    fi
    if [ -n "${LONG:-}" ]; then
        case "$LONG" in *.gz) gunzip -c "$LONG" > "$ROOT/long32k.jsonl" ;; *) cp "$LONG" "$ROOT/long32k.jsonl" ;; esac
    else
        python3 bench/split_gpu.py long-data --src "${DATA:-$ROOT/data}/train.jsonl" --out "$ROOT/long32k.jsonl" \
            --tokens 32768 --rows 48
    fi
    RUN="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
    for draft in ${SPLIT_DRAFTS:-"a5:5:512" "b2:2:128"}; do  # name:draft layers:anchors per sequence
        IFS=: read -r name layers anchors <<< "$draft"
        echo "[chain] split 32K: draft $name $(date +%T)"
        $RUN bench/split_gpu.py train --data "$ROOT/long32k.jsonl" --out "$ROOT/split32k_$name" --tokens 32768 \
            --minutes "${SPLIT_MINUTES:-1.5}" --layers "$layers" --anchors "$anchors" "${target[@]}" \
            > "$ROOT/split32k_$name.log" 2>&1 || { tail -n 30 "$ROOT/split32k_$name.log"; echo "[chain] split 32K $name failed"; }
        grep -E "^\[split\]|^\[train\] done" "$ROOT/split32k_$name.log" | tail -n 4
        # an if, not an && list: a false test as the loop's last command would fail this mode,
        # and with it the chain that runs it
        if [ -n "${OUT:-}" ] && [ -f "$ROOT/split32k_$name/split_summary.json" ]; then
            cp "$ROOT/split32k_$name/split_summary.json" "$OUT/split32k_${name}_summary.json"
        fi
    done
    ;;
run)
    source bench/device_smollm2.sh env
    export PYTHONUNBUFFERED=1 DATA="$ROOT/data"
    NUM=$2 MINUTES=$3 REQUESTS=$4
    mkdir -p "$ROOT"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    if [ "${SPLIT:-1}" = 1 ]; then IN_CHAIN=1 bash "$0" split; fi
    echo "[chain] start $(date +%T)"
    workload() {  # STAGES, then workload_draft_gpu.sh's environment; nothing with WORKLOAD=0
        [ "${WORKLOAD:-1}" = 1 ] || return 0
        WORK="$ROOT/workload" STAGES="$1" bash bench/workload_draft_gpu.sh "$NUM" "$MINUTES" "$REQUESTS" 2>&1
    }
    if [ "${FAMILIES:-0}" = 1 ]; then
        if [ "${TARGET:-smollm2-135m}" = gemma3-270m ]; then source bench/device_gemma3.sh env; fi
        families_in() {  # DIR MODE ARGS: family_compare_gpu.sh with the families' steps, prompts and tokens
            WORK="$1" MAX_STEPS=${FAMILY_STEPS:-800} PROMPTS=${FAMILY_PROMPTS:-20} \
                NEW_TOKENS=${FAMILY_NEW_TOKENS:-128} bash bench/family_compare_gpu.sh "${@:2}"; }
        fam() { families_in "$ROOT/families" "$@"; }
        rm -f "$ROOT/gen.done"
        { rc=0  # gen.done whatever gen did: the workload waits on it
          if [ "${FAMILY_ROWS:-3500}" -gt 0 ] && [ ! -f "$ROOT/families/train.jsonl" ]; then echo "[chain] families gen $(date +%T)"; fam gen "${FAMILY_ROWS:-3500}" || rc=$?; fi
          touch "$ROOT/gen.done"; [ "$rc" = 0 ] &&
          echo "[chain] families train $(date +%T)" && fam train "${FAMILY_MINUTES:-60}" && echo "[chain] families eval $(date +%T)" && fam eval; } \
            > "$ROOT/families.log" 2>&1 &
        families=$!
        workload rows || echo "[chain] workload rows failed"
        while [ ! -f "$ROOT/gen.done" ]; do sleep 5; done
        lengths=""
        if [ -n "${LENGTHS:-}" ]; then
            echo "[chain] lengths $(date +%T)"
            mkdir -p "$ROOT/lengths_out"  # the script's own copies (table, plot, logs), for collect
            # shellcheck disable=SC2086  # STEPS PER_BUCKET
            WORK="$ROOT/lengths" OUT="$ROOT/lengths_out" LOSS_CHUNK_ROWS=${LENGTHS_CHUNK_ROWS:-0} \
                bash bench/length_tau_gpu.sh all $LENGTHS \
                > "$ROOT/lengths.log" 2>&1 &
            lengths=$!
        fi
        full=""
        if [ "${FULL_VOCAB_RUN:-0}" = 1 ] && [ "${FAMILY_ROWS:-3500}" -gt 0 ] && [ ! -f "$ROOT/families/train.jsonl" ]; then
            # gen failed: the run would fall back to the raw rows and pair with nothing
            echo "[chain] whole-vocabulary run left out: the families have no regenerated rows to share"
        elif [ "${FULL_VOCAB_RUN:-0}" = 1 ]; then
            echo "[chain] whole-vocabulary run $(date +%T)"
            mkdir -p "$ROOT/full_vocab"  # the rows gen wrote, if it ran: the families train on them
            if [ -f "$ROOT/families/train.jsonl" ]; then cp "$ROOT/families/train.jsonl" "$ROOT/full_vocab/"; fi
            full_vocab() { RUNS="${FULL_VOCAB_RUNS:-dspark_b16:prefix}" DRAFT_VOCAB="" families_in "$ROOT/full_vocab" "$@"; }
            { full_vocab train "${FAMILY_MINUTES:-60}" && full_vocab eval; } > "$ROOT/full_vocab.log" 2>&1 &
            full=$!
        fi
        STEPS=${WORKLOAD_STEPS:-100000} workload train || echo "[chain] workload draft failed"
        if [ -n "${GPU_TESTS:-}" ]; then
            echo "[chain] tests $(date +%T)"
            # shellcheck disable=SC2086  # pytest arguments
            python3 -m pytest -q -p no:cacheprovider $GPU_TESTS > "$ROOT/gpu_tests.log" 2>&1 || true
            tail -n 3 "$ROOT/gpu_tests.log"
        fi
        wait "$families" || echo "[chain] families train or eval failed"
        first_run() {  # DRAFT: the first seed's run of that draft family, or nothing
            local seed=${SEEDS:-0}
            # || true: with no such run, ls fails the pipe (pipefail), and under set -e an assignment
            # from it ended the whole chain
            ls -d "$ROOT/families/seed${seed%% *}"/runs/*"draft=$1,"* 2>/dev/null | head -n 1 || true
        }
        fp8=""
        if [ "${FP8_TAU:-0}" = 1 ]; then
            run=$(first_run "${FP8_RUN:-dspark_b16}")
            echo "[chain] fp8 τ ${run:-(no run)} $(date +%T)"
            if [ -n "$run" ]; then
                python3 bench/draft_fp8_tau.py "$run" --device cuda --prompts "$DATA/heldout_prompts.jsonl" \
                    --num-prompts "${FP8_PROMPTS:-30}" --out "$ROOT/fp8_tau.json" > "$ROOT/fp8_tau.log" 2>&1 &
                fp8=$!
            fi
        fi
        if [ "${PATHS_CHECK:-0}" = 1 ]; then  # after FP8's start: both read checkpoints only, τ-sized work
            run=$(first_run "${PATHS_RUN:-dflash_b16}")
            echo "[chain] capture paths ${run:-(no run)} $(date +%T)"
            if [ -n "$run" ]; then
                python3 bench/capture_paths.py --target "${TARGET:-smollm2-135m}" --draft "$run" --prompts "$DATA/heldout_prompts.jsonl" \
                    --num-prompts 2 --new-tokens 160 --served-tokens 48 --out "$ROOT/capture_paths.json" \
                    > "$ROOT/capture_paths.log" 2>&1 || echo "[chain] capture paths failed"
                grep -E "^  |^first|^engine" "$ROOT/capture_paths.log" || tail -n 5 "$ROOT/capture_paths.log"
            fi
        fi
        if [ -n "$full" ]; then
            wait "$full" || echo "[chain] whole-vocabulary run failed"
            grep -E "^every run|^\| draft=" "$ROOT/full_vocab.log" || tail -n 20 "$ROOT/full_vocab.log"
        fi
        if [ -n "$fp8" ]; then
            wait "$fp8" || echo "[chain] fp8 τ failed"
            tail -n 2 "$ROOT/fp8_tau.log"
        fi
        if [ -n "$lengths" ]; then
            wait "$lengths" || echo "[chain] lengths failed"
            grep -E "^==|^\|" "$ROOT/lengths.log" | tail -n 20 || true
        fi
        grep -E "^\[chain\]|exit|^\| draft=" "$ROOT/families.log" || tail -n 20 "$ROOT/families.log"
        if [ -n "${BENCH_AFTER:-}" ]; then  # another chain's log: time nothing while it still runs
            end=$((SECONDS + ${BENCH_AFTER_MAX:-900}))
            until grep -qs "^\[chain\] done" "$BENCH_AFTER" || [ $SECONDS -ge $end ]; do sleep 5; done
            echo "[chain] benches from $(date +%T)"
        fi
        workload "bench probe" || echo "[chain] workload bench failed"
        if [ "${FAMILY_REQUESTS:-20}" -gt 0 ]; then  # 0: τ only (e.g. a second seed; bench serves the first)
            echo "[chain] families bench $(date +%T)"
            fam bench "${FAMILY_REQUESTS:-20}" 2>&1 || echo "[chain] families bench failed"
        fi
    else
        echo "[chain] workload draft $(date +%T)"
        workload "rows train bench probe" || echo "[chain] workload draft failed"
    fi
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
    # The workload bench's results, which a chain started in an earlier call wrote under $ROOT only:
    # JSON alone (it holds each table too), since a call brings back at most 8 files.
    cp "$ROOT"/workload/bench*.json "$ROOT"/workload/capture_paths.json "$out/" 2>/dev/null || true
    if [ -d "$ROOT/families" ]; then  # results.tar.gz and logs.tar.gz, the layout bench/family_compare.py reads
        mkdir -p "$out/families"
        WORK="$ROOT/families" OUT="$out/families" bash bench/family_compare_gpu.sh collect > /dev/null || true
    fi
    if [ -d "$ROOT/full_vocab" ]; then  # the same layout, without the rows (the families' copy has them)
        mkdir -p "$out/full_vocab"
        WORK="$ROOT/full_vocab" OUT="$out/full_vocab" bash bench/family_compare_gpu.sh collect > /dev/null || true
        rm -f "$out/full_vocab/regenerated.jsonl.gz"
    fi
    if [ -d "$ROOT/lengths_out" ]; then  # one file, to keep what comes back to a few
        tar czf "$out/lengths.tar.gz" -C "$ROOT" lengths_out
    fi
    tar czf "$out/logs.tar.gz" -C "$ROOT" --exclude='families' --exclude='full_vocab' --exclude='lengths' --exclude='lengths_out' --exclude='*.pt' --exclude='*.safetensors' --exclude='*.bin' \
        --exclude='rows.jsonl' --exclude='data' --exclude='long32k.jsonl' --exclude='global_step*' . 2>/dev/null || true
    ls -la "$out"
    ;;
esac
