#!/usr/bin/env bash
# The README's main job: set up, train a DSpark draft for SmolLM2-135M-Instruct on chitchat
# conversations (CPU, a few minutes), then measure it by real speculative decoding on held-out
# prompts next to an untrained draft. Extra arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/splitserve train experiment=quickstart "$@"
