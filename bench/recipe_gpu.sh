#!/usr/bin/env bash
# The recipe measured like the paper (docs/results/recipe_h200.md), on one GPU machine whose
# SmolLM2 parts were stashed by bench/device_smollm2.sh. Three steps, run while the machine stays warm:
#   bash bench/recipe_gpu.sh gen   SRC_DIR          replies sampled like DeepSpec's data (T=0.7, top-p 0.8,
#                                                   top-k 20) for SRC_DIR/{chat,instr,code}.jsonl
#                                                   (bench/recipe_sources.py), and the held-out chitchat
#                                                   prompts with their history regenerated greedily
#   bash bench/recipe_gpu.sh train MINUTES SEED...  bench/ablation_gpu.py train, one sweep per seed, all at once
#   bash bench/recipe_gpu.sh eval  SEED...          bench/ablation_gpu.py eval (serving engine), then a tarball
# Work lives in $WORK (default /tmp/recipe); results are copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_smollm2.sh env
WORK=${WORK:-/tmp/recipe}
mkdir -p "$WORK"
RUNS=${RUNS:-"dspark_b16:paper dflash_b16:dflash_ce dflash_b16:paper dspark_b16:prefix dspark_b16:prefix_gain dspark_b16:expected_length"}
export PYTHONUNBUFFERED=1
case "${1:?gen | train | eval}" in
gen)
    src=${2:?SRC_DIR}
    cat "$src"/chat.jsonl "$src"/instr.jsonl "$src"/code.jsonl > "$WORK/prompts.jsonl"
    cp "$src"/heldout_chat.jsonl "$WORK/heldout_chat.jsonl"
    python3 - "$WORK" <<'PY'
import json, sys, time
from pathlib import Path
from splitserve.data.gen import GenConfig, run_gen
work = Path(sys.argv[1])
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
summary = {}
for name, cfg in jobs.items():
    t0 = time.time()
    s = run_gen(cfg)
    summary[name] = {"seconds": round(time.time() - t0, 1), **{k: v for k, v in vars(s).items() if isinstance(v, (int, float, str))}}
    print(name, summary[name], flush=True)
(work / "gen_summary.json").write_text(json.dumps(summary, indent=1))
PY
    [ -n "${OUT:-}" ] && cp "$WORK"/train_sampled.jsonl "$WORK"/heldout_regen.jsonl "$WORK"/gen_summary.json "$OUT"/
    ;;
train)
    minutes=${2:?MINUTES}; shift 2
    for seed in "$@"; do
        python3 bench/ablation_gpu.py train --data "$WORK/train_sampled.jsonl" --prompts "$WORK/heldout_regen.jsonl" \
            --root "$WORK/seed$seed" --minutes "$minutes" --seed "$seed" --runs $RUNS --num-layers 4 --anchors "${ANCHORS:-64}" \
            --prompt-sets humaneval mtbench --no-regenerate-history --max-new-tokens 256 --num-prompts 40 \
            --save-every 100 > "$WORK/train_seed$seed.log" 2>&1 &
    done
    wait
    tail -n 20 "$WORK"/train_seed*.log
    ;;
eval)
    shift
    for seed in "$@"; do
        python3 bench/ablation_gpu.py eval --root "$WORK/seed$seed" --engine --no-exact --no-curve \
            > "$WORK/eval_seed$seed.log" 2>&1 &
    done
    wait
    for seed in "$@"; do tail -n 40 "$WORK/eval_seed$seed.log"; done
    if [ -n "${OUT:-}" ]; then
        (cd "$WORK" && tar czf "$OUT/recipe_sweeps.tar.gz" --exclude='checkpoints' --exclude='*.pt' \
            --exclude='*.safetensors' seed*/sweep seed*/train_summary.json ./*.log)
    fi
    ;;
esac
