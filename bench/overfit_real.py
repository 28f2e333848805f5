"""Overfit check on the real target: a draft trained on one target-generated sequence should
accept every block on it (τ = γ + 1).

    python bench/overfit_real.py [--gamma 8] [--steps 400] [--out docs/results/foundation/overfit_smollm2.json]
    python bench/overfit_real.py --target gemma3-270m --prompts humaneval --out FILE   (the optional second target)

Loss: the paper mix (0.1 CE + 0.9 TV + 1.0 confidence).

Runs on a CPU in a few minutes. The sequence is the target's own greedy answer to a held-out
prompt (chitchat by default), so acceptance is judged exactly as in serving.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from splitserve.config import DraftConfig, LossConfig, TargetConfig
from splitserve.evaluation.evaluate import evaluate
from splitserve.evaluation.heldout import load_prompt_ids
from splitserve.models.build import build_draft, resolve_arch
from splitserve.records import HiddenRecord
from splitserve.speculative.decode import target_decode
from splitserve.target.hf import load_hf_target
from splitserve.train.step import collate, draft_loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--anchors", type=int, default=48, help="anchors sampled per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ce-weight", type=float, default=0.1, help="0.1 is the paper mix")
    ap.add_argument("--prompt-index", type=int, default=0)
    ap.add_argument("--target", default="smollm2-135m", help="an embedded target's name or a HF directory")
    ap.add_argument("--prompts", default="chitchat", help="a prompt set's name or a JSONL file")
    ap.add_argument("--out", default="docs/results/foundation/overfit_smollm2.json")
    args = ap.parse_args()

    torch.manual_seed(0)
    target = load_hf_target(TargetConfig(name=Path(args.target).name, path=args.target, device="cpu"))
    prompt = load_prompt_ids(args.prompts, target.tokenizer, args.prompt_index + 1)[args.prompt_index]
    # No EOS stop: the sequence must be long enough for many full blocks.
    cont = target_decode(target, prompt, args.new_tokens)
    ids = torch.tensor(prompt + cont)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[len(prompt):] = True
    cap = target.capture(ids[None])
    batch = collate([HiddenRecord(0, ids, mask, cap.aux[0], cap.final[0])], target.device, torch.float32)

    arch = resolve_arch(DraftConfig(num_layers=1, block_size=args.gamma), target.info, target.config,
                        target.tokenizer)
    draft = build_draft(arch, target)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    loss_cfg = LossConfig(ce_weight=args.ce_weight)
    t0 = time.time()
    for step in range(args.steps):
        out, n = draft_loss(draft, batch, args.anchors, loss_cfg, torch.Generator().manual_seed(step))
        opt.zero_grad()
        out.total.backward()
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            m = out.metrics()
            print(f"step {step:4d} loss {m['loss']:.4f} alpha {m['alpha']:.3f} ({time.time() - t0:.0f}s)",
                  flush=True)
    # Every round's block must stay inside the trained sequence: stop γ+1 tokens short of its end.
    gen = args.new_tokens - (args.gamma + 1)
    report = evaluate(target, draft.eval(), [prompt], max_new_tokens=gen)
    result = {
        "target": target.info.name, "prompts": args.prompts, "gamma": args.gamma, "steps": args.steps, "train_seconds": round(time.time() - t0),
        "sequence_tokens": len(ids), "generated": gen, "lr": args.lr, "ce_weight": args.ce_weight,
        "anchors_per_step": args.anchors, "tau": report.tau, "accepts": report.results[0].accepts,
        "exact": report.exact_matches == 1,
    }
    print(json.dumps(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
