#!/usr/bin/env bash
# Split training on a CPU: 3 processes over gloo, rank 0 runs SmolLM2, ranks 1-2 train the
# draft (the embedded default; run `bash launch/setup.sh` first).
#
#   bash launch/cpu3.sh [hydra overrides...]
#
# Same recipe as the quickstart, so its result is comparable with a single-process run.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/torchrun --standalone --nproc-per-node 3 -m splitserve.cli train \
  experiment=quickstart split=1t2d run_dir=runs/quickstart-split "$@"
