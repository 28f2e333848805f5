#!/usr/bin/env bash
# Train a draft for any local Hugging Face causal LM on any chat JSONL.
# Usage: bash recipes/bring_your_own.sh /path/to/model /path/to/train.jsonl /path/to/prompts.jsonl [overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$1 TRAIN=$2 PROMPTS=$3
shift 3
NAME=$(basename "$MODEL")
.venv/bin/splitserve train target.path="$MODEL" target.name="$NAME" \
  data.train_path="$TRAIN" data.heldout_prompts="$PROMPTS" run_dir="runs/$NAME" "$@"
.venv/bin/splitserve export "runs/$NAME" "exports/$NAME"
