#!/usr/bin/env bash
# What to run where SGLang can run: a CUDA GPU with `pip install -e '.[sglang]'` (sglang 0.5.23),
# from the repo root. None of it has been run yet (docs/deploy.md). Each step writes to $OUT.
#   bash bench/sglang_target_gpu.sh            # all steps
#   STEPS="1 2" bash bench/sglang_target_gpu.sh
#
# 1  versions: sglang must be 0.5.23 (the backend refuses others), CUDA visible
# 2  target.backend=sglang captures == transformers' on the embedded SmolLM2-135M (bf16, per-layer
#    relative error < 2e-2, a right-padded row): tests/test_sglang_backend.py's GPU test
# 3  `splitserve dump target.backend=sglang` on 8 conversations, then read back by a 1-step train
# 4  an untrained DSpark draft exported with --format sglang and served by SGLang DSPARK with the
#    printed command: greedy output must equal the target's own greedy output (an untrained draft
#    accepts little, but a wrong layout or slot convention would change tokens or crash the load)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-bench_out/sglang_target}
STEPS=${STEPS:-"1 2 3 4"}
PORT=${PORT:-30123}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has 1; then
    "$PY" -c "import importlib.metadata as m, torch; print('sglang', m.version('sglang'), 'torch', torch.__version__, \
'cuda', torch.cuda.is_available())" | tee "$OUT/1_versions.txt"
fi

if has 2; then
    "$PY" -m pytest -q tests/test_sglang_backend.py -k within_bf16 2>&1 | tee "$OUT/2_backend_parity.txt"
fi

if has 3; then
    "$PY" -m splitserve.cli dump target.backend=sglang target.dtype=bfloat16 data.max_samples=8 \
        dump.out_dir="$OUT/3_dump" 2>&1 | tee "$OUT/3_dump.txt"
    "$PY" -m splitserve.cli train data.dump_dir="$OUT/3_dump" train.max_steps=1 run_dir="$OUT/3_train" \
        2>&1 | tail -5 | tee -a "$OUT/3_dump.txt"
fi

if has 4; then
    # an untrained draft for the embedded target, exported as a run would be
    "$PY" - "$OUT/4_hf" <<'EOF'
import sys
import torch
from splitserve.config import DraftConfig, TargetConfig
from splitserve.export import export_draft
from splitserve.models.build import build_draft, resolve_arch
from splitserve.target.hf import load_hf_target

target = load_hf_target(TargetConfig(device="cpu"))
torch.manual_seed(0)
draft = build_draft(resolve_arch(DraftConfig(), target.info, target.config), target)
export_draft(draft, sys.argv[1], target.info)
EOF
    "$PY" -m splitserve.cli export "$OUT/4_hf" "$OUT/4_sglang" --format sglang | tee "$OUT/4_export.txt"
    cmd=$(sed -n '/python -m sglang.launch_server/,$p' "$OUT/4_export.txt" | tr -d '\\\n')
    # the target alone, then with the draft: same prompt, greedy
    target_dir=$(echo "$cmd" | sed -E 's/.*--model-path ([^ ]+).*/\1/')
    for mode in plain dspark; do
        if [ "$mode" = plain ]; then run="$PY -m sglang.launch_server --model-path $target_dir"; else run=$cmd; fi
        eval "$run --port $PORT" >"$OUT/4_server_$mode.log" 2>&1 &
        pid=$!
        for _ in $(seq 120); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 5; done
        curl -s "localhost:$PORT/generate" -H 'Content-Type: application/json' -d \
            '{"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 64}}' \
            >"$OUT/4_generate_$mode.json"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
    "$PY" - "$OUT" <<'EOF' | tee "$OUT/4_verdict.txt"
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/4_generate_{m}.json")) for m in ("plain", "dspark"))
print("greedy output identical:", a["text"] == b["text"])
print("meta (dspark):", json.dumps(b.get("meta_info", {}))[:400])
EOF
fi
echo "results in $OUT"
