#!/usr/bin/env bash
# The recipe measured like the paper (docs/results/recipe_h200.md), on one GPU machine whose
# SmolLM2 parts were stashed by bench/device_smollm2.sh. Three steps, run while the machine stays warm:
#   bash bench/recipe_gpu.sh gen   SRC_DIR          replies sampled like DeepSpec's data (T=0.7, top-p 0.8,
#                                                   top-k 20) for SRC_DIR/{chat,instr,code}.jsonl
#                                                   (bench/recipe_sources.py), and the held-out chitchat
#                                                   prompts with their history regenerated greedily
#   bash bench/recipe_gpu.sh train MINUTES SEED...  bench/ablation_gpu.py train, one sweep per seed, all at once
#   bash bench/recipe_gpu.sh eval  SEED...          bench/ablation_gpu.py eval (serving engine), then a tarball
# Sizing (environment): GEN_ROWS rows of each source, GEN_SECONDS for the sampled job, HELDOUT_ROWS
# held-out conversations; RUNS (DRAFT:LOSS ...), NUM_PROMPTS per held-out set and ANCHORS for train;
# EVAL_SECONDS for eval.
# Work lives in $WORK (default /tmp/recipe); results are copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
# no `datasets` there: bench/shim stands in for the calls that tokenizing a JSONL file makes
python3 -c "import datasets" 2>/dev/null || export PYTHONPATH="$PWD/bench/shim:$PYTHONPATH"
WORK=${WORK:-/tmp/recipe}
mkdir -p "$WORK"
RUNS=${RUNS:-"dspark_b16:paper dflash_b16:dflash_ce dflash_b16:paper dspark_b16:prefix dspark_b16:prefix_gain dspark_b16:expected_length"}
export PYTHONUNBUFFERED=1
case "${1:?gen | train | eval}" in
gen)
    src=${2:?SRC_DIR}
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
    cat > "$WORK/gen_job.py" <<'PY'
import json, sys, time
from pathlib import Path
from splitserve.data.gen import GenConfig, run_gen
work, name = Path(sys.argv[1]), sys.argv[2]
common = dict(target="smollm2-135m", max_new_tokens=256, batch_size=256, device="cuda", dtype="bfloat16")
jobs = {
    # DeepSpec regenerates its training replies with these sampling settings
    "train_sampled": GenConfig(data=str(work / "prompts.jsonl"), out=str(work / "train_sampled.jsonl"),
                               temperature=0.7, top_p=0.8, top_k=20, max_turns=2, **common),
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
    # the two jobs share the GPU (the held-out one is short and latency-bound); the target is
    # converted from its GGUF once, before they start, not by both at once
    python3 -c "from splitserve.assets import smollm2_dir; print(smollm2_dir())"
    t0=$(date +%s)
    python3 "$WORK/gen_job.py" "$WORK" heldout_regen > "$WORK/gen_heldout.log" 2>&1 &
    held=$!
    timeout "${GEN_SECONDS:-100000}" python3 "$WORK/gen_job.py" "$WORK" train_sampled > "$WORK/gen_sampled.log" 2>&1 \
        || echo "train_sampled stopped after $(( $(date +%s) - t0 )) s (GEN_SECONDS=${GEN_SECONDS:-}); keeping the rows written"
    wait "$held"
    tail -n 3 "$WORK/gen_heldout.log" "$WORK/gen_sampled.log"
    # drop a torn last line left by the stop
    python3 - "$WORK/train_sampled.jsonl" <<'PY'
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
print(f"train_sampled.jsonl: {len(rows)} rows, {sum(r.get('turns', 0) for r in rows)} replies, "
      f"{sum(r.get('new_tokens', 0) for r in rows)} reply tokens ({len(lines) - len(good)} torn lines dropped)")
PY
    [ -n "${OUT:-}" ] && cp "$WORK"/train_sampled.jsonl "$WORK"/heldout_regen.jsonl "$WORK"/gen_summary_*.json \
        "$WORK"/gen_*.log "$OUT"/ || true
    ;;
train)
    minutes=${2:?MINUTES}; shift 2
    for seed in "$@"; do
        python3 bench/ablation_gpu.py train --data "$WORK/train_sampled.jsonl" --prompts "$WORK/heldout_regen.jsonl" \
            --root "$WORK/seed$seed" --minutes "$minutes" --seed "$seed" --runs $RUNS --num-layers 4 --anchors "${ANCHORS:-64}" \
            --prompt-sets humaneval mtbench --no-regenerate-history --max-new-tokens 256 --num-prompts "${NUM_PROMPTS:-40}" \
            --save-every 100 > "$WORK/train_seed$seed.log" 2>&1 &
    done
    wait
    tail -n 20 "$WORK"/train_seed*.log
    ;;
eval)
    shift
    # EVAL_SECONDS bounds the evaluation so that the tarball is still written: a run that finished
    # has its eval.json, and `splitserve report` can be rerun on the unpacked sweep anywhere.
    for seed in "$@"; do
        timeout "${EVAL_SECONDS:-100000}" python3 bench/ablation_gpu.py eval --root "$WORK/seed$seed" --engine \
            --no-exact --no-curve > "$WORK/eval_seed$seed.log" 2>&1 &
    done
    wait || true
    for seed in "$@"; do tail -n 60 "$WORK/eval_seed$seed.log"; done
    if [ -n "${OUT:-}" ]; then
        (cd "$WORK" && tar czf "$OUT/recipe_sweeps.tar.gz" --exclude='checkpoints' --exclude='*.pt' \
            --exclude='*.safetensors' seed*/sweep seed*/train_summary.json seed*/runs/*/metrics.jsonl \
            seed*/runs/*/*.log ./*.log)
    fi
    ;;
esac
