"""Where one in-process training step's time goes (the ablation recipe), SmolLM2 shape, random weights.

    python bench/train_step_gpu.py [--gamma 8 16] [--batch 8] [--anchors 64] [--capture-graphs]
        [--group-tokens 4096] [--loss-chunk-rows N] [--out FILE]

One step of `splitserve train` with the target in-process, split into its phases and timed
with a device sync after each: target capture (TargetSource: one forward per sample, or one per
length-bucket group with --group-tokens), collate (records -> padded batch on the device), anchor
planning, draft forward + loss, backward, optimiser step; and the peak device memory. Then the
whole step under torch.profiler: GPU busy time against wall time says whether the step is bound
by the GPU or by the host. Sequence lengths follow the
regenerated chitchat set (mean ~210 tokens). Step time does not depend on weight values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from roles_gpu import smollm2_shape

from splitserve.config import DraftConfig, LossConfig, TargetConfig
from splitserve.data.chat import TokenizedSample
from splitserve.models.build import build_draft, resolve_arch
from splitserve.stream.sources import TargetSource
from splitserve.target.hf import wrap_hf_model
from splitserve.train.step import collate, draft_loss, plan_blocks, row_generators


def samples(n: int, vocab: int, seed: int = 0) -> list[TokenizedSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(100, 320, (1,), generator=g))
        ids = torch.randint(vocab, (length,), generator=g).tolist()
        mask = [0] * (length // 3) + [1] * (length - length // 3)  # prompt, then assistant reply
        out.append(TokenizedSample(ids, mask, f"synthetic:{i}", False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--capture-graphs", action="store_true", help="bucketed CUDA-graph captures (target/bucketed.py)")
    ap.add_argument("--group-tokens", type=int, default=0,
                    help="with --capture-graphs: a bucket's samples share a forward, this many tokens' worth")
    ap.add_argument("--loss-chunk-rows", type=int, default=0,
                    help="train.loss_chunk_rows: the vocabulary-wide loss terms this many rows at a time")
    ap.add_argument("--compile-loss", action="store_true",
                    help="probe: torch.compile(dynamic=True) around the loss (train/losses.compute_loss)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer target, for a quick CPU check of the script")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    dev = torch.device(args.device)
    if args.compile_loss:
        import splitserve.train.step as train_step

        train_step.compute_loss = torch.compile(train_step.compute_loss, dynamic=True)
    cfg = smollm2_shape()
    if args.tiny:
        cfg.num_hidden_layers, cfg.vocab_size = 4, 2048
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with dev:
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    target = wrap_hf_model(model, TargetConfig(name="smollm2-shape", dtype=str(dtype).removeprefix("torch."),
                                               device=args.device, num_capture_layers=5 if not args.tiny else 2))
    source = TargetSource(target, samples(args.batch * args.steps, cfg.vocab_size), bucketed=args.capture_graphs,
                          group_tokens=args.group_tokens)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    results = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "batch": args.batch,
               "capture_graphs": args.capture_graphs, "group_tokens": args.group_tokens,
               "compile_loss": args.compile_loss, "loss_chunk_rows": args.loss_chunk_rows,
               "anchors_per_seq": args.anchors, "draft_layers": args.layers}
    for gamma in args.gamma:
        torch.manual_seed(0)
        arch = resolve_arch(DraftConfig(num_layers=args.layers, block_size=gamma, mask_token_id=1), target.info,
                            model.config)
        draft = build_draft(arch, target).float().to(dev)
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
        phases: dict[str, list[float]] = {}

        def step(i: int, record: bool) -> None:
            marks = [("start", time.perf_counter())]

            def mark(name):
                sync()
                marks.append((name, time.perf_counter()))

            records = source.get(list(range(i * args.batch, (i + 1) * args.batch)))
            mark("capture")
            batch = collate(records, dev, torch.float32)
            mark("collate")
            packed = plan_blocks(draft, batch, args.anchors, row_generators(0, i, range(args.batch)))
            mark("plan")
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                out, _ = draft_loss(draft, batch, args.anchors, LossConfig(), None, packed=packed,
                                    chunk_rows=args.loss_chunk_rows)
            mark("draft forward + loss")
            out.total.backward()
            mark("backward")
            opt.step()
            opt.zero_grad(set_to_none=True)
            mark("optimizer")
            if record:
                for (_, t0), (name, t1) in zip(marks, marks[1:]):
                    phases.setdefault(name, []).append(1000 * (t1 - t0))

        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        step(0, False)  # warm-up: allocator, kernels
        for i in range(1, args.steps - 1):
            step(i, True)
        row = {name: statistics.median(v) for name, v in phases.items()}
        row["total"] = sum(row.values())
        if dev.type == "cuda":
            # target, draft, optimiser state and the largest step's activations
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                step(args.steps - 1, False)
                wall = time.perf_counter() - t0
            gpu_us = sum(e.device_time_total for e in prof.key_averages())  # kernels, copies, memsets
            row["profiled_step_wall_ms"] = 1000 * wall
            row["profiled_step_gpu_busy_ms"] = gpu_us / 1000
            row["top_gpu_ops"] = [{"name": e.key[:100], "ms": e.device_time_total / 1000, "calls": e.count}
                                  for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]]
        results[f"gamma_{gamma}"] = row
        print(f"γ={gamma}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items() if isinstance(v, float)),
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
