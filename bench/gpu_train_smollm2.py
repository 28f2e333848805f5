"""Train the quickstart draft on a GPU for a few minutes, then measure held-out τ.

    python bench/gpu_train_smollm2.py --train TRAIN.jsonl --prompts PROMPTS.jsonl \
        --minutes 5 --out OUT_DIR [--max-steps N] [--gamma 8] [--layers 2] [--max-length 1024] [--batch-size 16] \
        [--anchors 64] [--eval-prompts 40] [--context-window 0]

The same code path as `splitserve train experiment=quickstart` (in-process target, paper
loss, held-out evaluation next to an untrained draft), without Hydra so that it runs on a
machine with only torch and transformers; the target is the embedded SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse

from splitserve.config import DataConfig, DraftConfig, EvalConfig, RunConfig, TargetConfig, TrainConfig
from splitserve.evaluation.heldout import evaluate_run
from splitserve.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--max-steps", type=int, default=100000,
                    help="stop at this step if the minutes last that long: a run that shares its GPU with others "
                         "then trains the same steps, only slower")
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--context-window", type=int, default=0,
                    help="draft.context_window: the block attends to the last N context positions (0: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = RunConfig(
        target=TargetConfig(),
        draft=DraftConfig(name=f"dspark_b{args.gamma}", block_size=args.gamma, num_layers=args.layers,
                          context_window=args.context_window),
        data=DataConfig(train_path=args.train, heldout_prompts=args.prompts, max_length=args.max_length,
                        max_samples=args.max_samples),
        train=TrainConfig(max_steps=args.max_steps, max_minutes=args.minutes, batch_size=args.batch_size, anchors_per_seq=args.anchors,
                          lr=1e-3, warmup_steps=50, log_every=50, save_every=100000),
        eval=EvalConfig(num_prompts=args.eval_prompts, max_new_tokens=96),
        run_dir=args.out,
    )
    result = train(cfg)
    evaluate_run(cfg, result.target, result.draft)


if __name__ == "__main__":
    main()
