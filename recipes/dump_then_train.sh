#!/usr/bin/env bash
# Offline path on the embedded default: dump -> train from the dump -> eval -> export -> eval.
# Usage: bash recipes/dump_then_train.sh [extra hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
SS=.venv/bin/splitserve
DUMP=dumps/smollm2-chitchat
RUN=runs/from-dump
$SS dump data.max_samples=500 data.max_length=192 dump.out_dir=$DUMP "$@"
$SS train experiment=quickstart data.max_samples=500 data.dump_dir=$DUMP run_dir=$RUN "$@"
$SS export $RUN exports/from-dump
$SS eval --draft exports/from-dump --num-prompts 10 --max-new-tokens 48
