#!/usr/bin/env bash
# Split training on one node with 8 GPUs: one torchrun job, target ranks and draft ranks.
#
#   bash launch/node8.sh                       # 4 target + 4 draft ranks (split=4t4d)
#   bash launch/node8.sh split=1t7d target.path=/models/Qwen3-8B data.train_path=regen.jsonl
#
# Every rank has its own GPU, so hidden states travel over NCCL point-to-point and the draft
# ranks train under DeepSpeed ZeRO over their own process group. Extra arguments are Hydra
# overrides and win over the defaults below. Rerunning the same command resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/torchrun --standalone --nproc-per-node "${GPUS:-8}" -m splitserve.cli train \
  split=4t4d target.dtype=bfloat16 split.wire_dtype=bfloat16 \
  train.backend=deepspeed train.zero_stage=1 train.precision=bf16 \
  data.max_length=8192 "$@"
