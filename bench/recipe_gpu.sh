#!/usr/bin/env bash
# The recipe measured like the paper (docs/results/recipe_h200.md), on one GPU machine whose
# SmolLM2 parts were stashed by bench/device_smollm2.sh. Four steps, run while the machine stays warm:
#   bash bench/recipe_gpu.sh gen   SRC_DIR          replies sampled like DeepSpec's data (T=0.7, top-p 0.8,
#                                                   top-k 20) for SRC_DIR/{chat,instr,code}.jsonl
#                                                   (bench/recipe_sources.py), and the held-out chitchat
#                                                   prompts with their history regenerated greedily
#                                                   (SRC_DIR holding both files from an earlier gen: reused)
#                                                   (GREEDY=1: the same prompts answered greedily
#                                                   alongside, sharing the GPU: see gen_greedy)
#   bash bench/recipe_gpu.sh gen_greedy             the prompts of the last gen answered greedily
#                                                   (train_greedy.jsonl); then train_{sampled,greedy}_matched.jsonl,
#                                                   each file's rows of the prompts both reached
#                                                   (GEN_SECONDS may stop either early)
#   bash bench/recipe_gpu.sh train MINUTES SEED...  bench/ablation_gpu.py train, one sweep per seed, all at once
#   bash bench/recipe_gpu.sh eval  SEED...          bench/ablation_gpu.py eval (serving engine), then a tarball
#   bash bench/recipe_gpu.sh tpot  SEED             the best draft's spec vs AR TPOT (splitserve bench), FP8 agreement
# Sizing (environment): GEN_ROWS rows of each source, GEN_SECONDS for the sampled (or greedy) job,
# HELDOUT_ROWS held-out conversations; RUNS (DRAFT:LOSS ...), NUM_PROMPTS per held-out set, ANCHORS and
# LOSS_CHUNK_ROWS (train.loss_chunk_rows, for ANCHORS=512), DATA (the training file in $WORK, default
# train_sampled.jsonl) for train; TAG, a suffix of the sweep's folder (seed$SEED$TAG), for train and eval;
# EVAL_SECONDS for eval, STEP to measure every run at that checkpoint instead of S* (to pair a run
# with one of an earlier sweep on the same data and seed), CURVE=1 to also measure the greedy
# τ-vs-tokens points (checkpoints at about S*/3 and 2S*/3).
# Work lives in $WORK (default /tmp/recipe); results are copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
WORK=${WORK:-/tmp/recipe}
mkdir -p "$WORK"
RUNS=${RUNS:-"dspark_b16:paper dflash_b16:dflash_ce dflash_b16:paper dspark_b16:prefix dspark_b16:prefix_gain dspark_b16:expected_length"}
export PYTHONUNBUFFERED=1

write_gen_job() {  # $WORK/gen_job.py WORK NAME runs one generation job of the recipe
    cat > "$WORK/gen_job.py" <<'PY'
import json, os, sys, time
from pathlib import Path
from splitserve.data.gen import GenConfig, run_gen
work, name = Path(sys.argv[1]), sys.argv[2]
common = dict(target="smollm2-135m", max_new_tokens=256, batch_size=256,  # GEN_DEVICE=cpu to try it out
              device=os.environ.get("GEN_DEVICE", "cuda"), dtype=os.environ.get("GEN_DTYPE", "bfloat16"))
jobs = {
    # DeepSpec regenerates its training replies with these sampling settings
    "train_sampled": GenConfig(data=str(work / "prompts.jsonl"), out=str(work / "train_sampled.jsonl"),
                               temperature=0.7, top_p=0.8, top_k=20, max_turns=2, **common),
    # the same prompts (user turns), answered greedily
    "train_greedy": GenConfig(data=str(work / "prompts.jsonl"), out=str(work / "train_greedy.jsonl"),
                              temperature=0.0, max_turns=2, **common),
    # held-out prompts: every history turn is the target's own greedy reply (the last reply is dropped
    # when the file is read as prompts)
    "heldout_regen": GenConfig(data=str(work / "heldout_chat.jsonl"), out=str(work / "heldout_regen.jsonl"),
                               temperature=0.0, **common),
}
t0 = time.time()
s = run_gen(jobs[name])
summary = {"seconds": round(time.time() - t0, 1), **{k: v for k, v in vars(s).items() if isinstance(v, (int, float, str))}}
print(name, summary, flush=True)
(work / f"gen_summary_{name}.json").write_text(json.dumps(summary, indent=1))
PY
}

drop_torn_lines() {  # FILE: a job stopped by GEN_SECONDS may leave a torn last line
    python3 - "$1" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
good = []
for line in lines:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        continue
    good.append(line)
open(sys.argv[1], "w").write("".join(g + "\n" for g in good))
rows = [json.loads(g).get("gen", {}) for g in good]
print(f"{sys.argv[1]}: {len(rows)} rows, {sum(r.get('turns', 0) for r in rows)} replies, "
      f"{sum(r.get('new_tokens', 0) for r in rows)} reply tokens ({len(lines) - len(good)} torn lines dropped)")
PY
}

match_greedy() {  # each of train_{sampled,greedy}.jsonl cut to the prompts both reached
    drop_torn_lines "$WORK/train_greedy.jsonl"
    # gen.source_line: the 1-based line of prompts.jsonl a row answers; rows in prompt order
    python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
rows = {k: {json.loads(l)["gen"]["source_line"]: l for l in (work / f"train_{k}.jsonl").read_text().splitlines()}
        for k in ("sampled", "greedy")}
both = sorted(set(rows["sampled"]) & set(rows["greedy"]))
for k, by_line in rows.items():
    out = work / f"train_{k}_matched.jsonl"
    out.write_text("".join(by_line[i] + "\n" for i in both))
    print(f"{out.name}: {len(both)} of {len(by_line)} rows, the prompts both files answer")
PY
}

case "${1:?gen | gen_greedy | train | eval | tpot}" in
gen)
    src=${2:?SRC_DIR}
    if [ -f "$src/train_sampled.jsonl" ] && [ -f "$src/heldout_regen.jsonl" ]; then
        # data generated by an earlier session (brought back from $OUT): reuse it as it is
        cp "$src/train_sampled.jsonl" "$src/heldout_regen.jsonl" "$WORK"/
        [ -f "$src/train_greedy.jsonl" ] && cp "$src/train_greedy.jsonl" "$WORK"/  # gen_greedy resumes from it
        wc -l "$WORK/train_sampled.jsonl" "$WORK/heldout_regen.jsonl"
        exit 0
    fi
    # GEN_ROWS: at most this many rows of each source, interleaved chat/instr/code so that a run
    # stopped by GEN_SECONDS keeps all three in proportion; the rows written by then are the data
    # (gen writes each row when its conversation ends). HELDOUT_ROWS: held-out conversations kept.
    python3 - "$src" "$WORK/prompts.jsonl" "${GEN_ROWS:-0}" <<'PY'
import sys
from itertools import zip_longest
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = [open(f"{src}/{k}.jsonl").read().splitlines()[:n or None] for k in ("chat", "instr", "code")]
rows = [r for group in zip_longest(*files) for r in group if r]
open(out, "w").write("".join(r + "\n" for r in rows))
print(f"{len(rows)} prompts ({', '.join(str(len(f)) for f in files)} chat, instr, code)")
PY
    head -n "${HELDOUT_ROWS:-1000000}" "$src"/heldout_chat.jsonl > "$WORK/heldout_chat.jsonl"
    write_gen_job
    # the two jobs share the GPU (the held-out one is short and latency-bound); the target is
    # converted from its GGUF once, before they start, not by both at once
    python3 -c "from splitserve.assets import smollm2_dir; print(smollm2_dir())"
    t0=$(date +%s)
    python3 "$WORK/gen_job.py" "$WORK" heldout_regen > "$WORK/gen_heldout.log" 2>&1 &
    held=$!
    if [ -n "${GREEDY:-}" ]; then  # small-batch decoding leaves the GPU room for a second job
        timeout "${GEN_SECONDS:-100000}" python3 "$WORK/gen_job.py" "$WORK" train_greedy > "$WORK/gen_greedy.log" 2>&1 &
        greedy=$!
    fi
    timeout "${GEN_SECONDS:-100000}" python3 "$WORK/gen_job.py" "$WORK" train_sampled > "$WORK/gen_sampled.log" 2>&1 \
        || echo "train_sampled stopped after $(( $(date +%s) - t0 )) s (GEN_SECONDS=${GEN_SECONDS:-}); keeping the rows written"
    wait "$held"
    [ -n "${GREEDY:-}" ] && { wait "$greedy" || echo "train_greedy stopped (GEN_SECONDS=${GEN_SECONDS:-}); keeping the rows written"; }
    tail -n 3 "$WORK"/gen_*.log
    drop_torn_lines "$WORK/train_sampled.jsonl"
    [ -n "${GREEDY:-}" ] && match_greedy
    [ -n "${OUT:-}" ] && cp "$WORK"/train_*.jsonl "$WORK"/heldout_regen.jsonl "$WORK"/gen_summary_*.json \
        "$WORK"/gen_*.log "$OUT"/ || true
    ;;
gen_greedy)
    [ -f "$WORK/prompts.jsonl" ] || { echo "gen_greedy: no $WORK/prompts.jsonl; run gen on this machine first"; exit 1; }
    write_gen_job
    timeout "${GEN_SECONDS:-100000}" python3 "$WORK/gen_job.py" "$WORK" train_greedy > "$WORK/gen_greedy.log" 2>&1 \
        || echo "train_greedy stopped (GEN_SECONDS=${GEN_SECONDS:-}); keeping the rows written"
    tail -n 2 "$WORK/gen_greedy.log"
    match_greedy
    [ -n "${OUT:-}" ] && cp "$WORK"/train_greedy*.jsonl "$WORK"/train_sampled_matched.jsonl "$WORK"/gen_summary_train_greedy.json \
        "$WORK"/gen_greedy.log "$OUT"/ || true
    ;;
train)
    minutes=${2:?MINUTES}; shift 2
    pids=()
    for seed in "$@"; do
        python3 bench/ablation_gpu.py train --data "$WORK/${DATA:-train_sampled.jsonl}" --prompts "$WORK/heldout_regen.jsonl" \
            --root "$WORK/seed$seed${TAG:-}" --minutes "$minutes" --seed "$seed" --runs $RUNS --num-layers 4 --anchors "${ANCHORS:-64}" --loss-chunk-rows "${LOSS_CHUNK_ROWS:-0}" \
            --prompt-sets humaneval mtbench --no-regenerate-history --max-new-tokens 256 --num-prompts "${NUM_PROMPTS:-40}" \
            --save-every 100 > "$WORK/train_seed$seed${TAG:-}.log" 2>&1 &
        pids+=($!)
    done
    rc=0  # a bare `wait` returns 0 whatever the runs did: wait for each
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    tail -n 20 "$WORK"/train_seed*.log
    exit "$rc"
    ;;
eval)
    shift
    pids=()
    # EVAL_SECONDS bounds the evaluation so that the tarball is still written: a run that finished
    # has its eval.json, and `splitserve report` can be rerun on the unpacked sweep anywhere.
    for seed in "$@"; do
        timeout "${EVAL_SECONDS:-100000}" python3 bench/ablation_gpu.py eval --root "$WORK/seed$seed${TAG:-}" --engine \
            --no-exact $([ -n "${CURVE:-}" ] || echo --no-curve) ${STEP:+--step "$STEP"} > "$WORK/eval_seed$seed${TAG:-}.log" 2>&1 &
        pids+=($!)
    done
    rc=0  # an evaluation stopped by EVAL_SECONDS (124) or failed: said here, and the tarball is still written
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    [ "$rc" = 0 ] || echo "an evaluation exited with $rc (124: stopped by EVAL_SECONDS)"
    for seed in "$@"; do tail -n 60 "$WORK/eval_seed$seed${TAG:-}.log"; done
    if [ -n "${OUT:-}" ]; then
        (cd "$WORK" && tar czf "$OUT/recipe_sweeps.tar.gz" --exclude='checkpoints' --exclude='*.pt' \
            --exclude='*.safetensors' seed*/sweep seed*/train_summary.json seed*/runs/*/metrics.jsonl \
            seed*/runs/*/*.log ./*.log)
    fi
    ;;
tpot)
    # issue 23's trained-draft figure: the best measured checkpoint of the seed's sweep served by
    # `splitserve bench` on the held-out chat prompts, speculative against the engine's own AR
    # (and transformers generate), eager draft then compiled; then FP8's agreement with the model
    seed=${2:?SEED}
    dest=${OUT:-$WORK}
    best=$(python3 bench/ablation_gpu.py best --root "$WORK/seed$seed${TAG:-}")
    cp "$best/source.json" "$dest/bench_seed${seed}_draft.json"
    cat "$best/source.json"; echo
    for variant in eager compiled; do
        flags=(); [ "$variant" = compiled ] && flags=(--compile)
        python3 -m splitserve.cli bench --draft "$best" --prompts "$WORK/heldout_regen.jsonl" --num-requests "${TPOT_REQUESTS:-12}" \
            --output-len "${TPOT_TOKENS:-256}" --baseline --hf-baselines "${flags[@]}" --json "$dest/bench_seed${seed}_$variant.json" \
            > "$WORK/bench_$variant.log" 2>&1 || echo "bench $variant: exit $?"
        grep "^|" "$WORK/bench_$variant.log" || tail -n 20 "$WORK/bench_$variant.log"
    done
    python3 bench/fp8_agreement.py --out "$dest/fp8_agreement_gpu.json" --sets "$WORK/heldout_regen.jsonl" \
        humaneval mtbench --num-prompts 12 --max-tokens 256 --device cuda --dtype bfloat16 \
        > "$WORK/fp8_agreement.log" 2>&1 || echo "fp8_agreement: exit $?"
    tail -n 8 "$WORK/fp8_agreement.log"
    ;;
esac
