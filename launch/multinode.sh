#!/usr/bin/env bash
# Split training across nodes: plain torchrun rendezvous, nothing home-made.
#
# Run on every node (same command, same overrides), e.g. two nodes of 8 GPUs:
#   NNODES=2 MASTER_ADDR=node0.cluster bash launch/multinode.sh \
#     split.target_ranks=[0,1,2,3,8,9,10,11] run_dir=/shared/runs/exp1
#
# Global ranks are assigned by torchrun (node n holds ranks 8n..8n+7); `split.target_ranks`
# says which of them run the target (default: the first split.num_target_ranks). The run
# directory must be on a filesystem every node sees: checkpoints are written by the draft
# ranks and resume reads them. DeepSpeed ZeRO spans the draft ranks of all nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NNODES:?set NNODES}" "${MASTER_ADDR:?set MASTER_ADDR (the rendezvous host)}"
exec .venv/bin/torchrun \
  --nnodes "$NNODES" --nproc-per-node "${GPUS:-8}" \
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv-id "${JOB_ID:-splitserve}" \
  -m splitserve.cli train \
  target.dtype=bfloat16 split.wire_dtype=bfloat16 train.backend=deepspeed train.precision=bf16 "$@"
