"""Split training on GPU: the per-role rates, trainer wait, channel bandwidth and peak memory.

Three modes, each under torchrun (two ranks: the target rank and one draft rank; on a machine
with one GPU both share it, so the transport is gloo staged through host memory):

    python bench/split_gpu.py long-data --src train.jsonl --out long.jsonl --tokens 8192 --rows 64 [--tokenizer DIR]
        concatenate chitchat conversations into multi-turn conversations of about 8K tokens
    python bench/split_gpu.py shape-target --like DIR --out DIR2
        the target's shape and tokenizer (DIR: config.json, tokenizer files) with random weights,
        for `train --target-path DIR2` where the real weights cannot travel (rates and memory
        do not depend on weight values)
    torchrun --nproc-per-node 2 bench/split_gpu.py copy --tokens 8192 --out copy.json [--backend nccl]
        raw copy bandwidths (device-device, device-host, host-device, pinned and not) and the
        channel alone (records of 8K tokens sent as fast as the channel takes them, no model);
        --backend nccl on a machine with a GPU per rank sends the payloads GPU to GPU (headers
        and credits over a gloo group of the pair, as split.transport=nccl does)
    torchrun --nproc-per-node 2 bench/split_gpu.py train --data long.jsonl --out RUN [--transport nccl] [...]
        the real split job (SmolLM2 target, DSpark draft, DeepSpeed), as `splitserve train`
        would run it, without Hydra so that it runs where only torch and transformers are

Results: RUN/split_summary.json, RUN/metrics.jsonl, copy.json; docs/results/split_h200.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def make_long_data(src: str, out: str, tokens: int, rows: int, tokenizer: str | None = None) -> None:
    """Real conversations, joined turn after turn until each row has about `tokens` tokens."""
    from transformers import AutoTokenizer

    from splitserve.assets import smollm2_dir

    tok = AutoTokenizer.from_pretrained(tokenizer or smollm2_dir())
    convs = [json.loads(line)["messages"] for line in open(src)]
    written, cur, cur_len, i = 0, [], 0, 0
    with open(out, "w") as f:
        while written < rows and i < len(convs):
            msgs = convs[i]
            i += 1
            cur.extend(msgs)
            cur_len += sum(len(tok(m["content"]).input_ids) + 5 for m in msgs)
            if cur_len >= tokens:
                f.write(json.dumps({"messages": cur}) + "\n")
                written, cur, cur_len = written + 1, [], 0
    print(f"wrote {written} rows of >= {tokens} tokens from {i} conversations to {out}")


def shape_target(like: str, out: str) -> None:
    """A checkpoint of the same shape and tokenizer as `like` (a config.json and tokenizer files)
    with seeded random bf16 weights: the split job's rates and memory do not depend on weight
    values, so this stands in for the real target where its weights cannot travel."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    Path(out).mkdir(parents=True, exist_ok=True)
    for f in Path(like).iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, Path(out) / f.name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(like), dtype=torch.bfloat16)
    model.save_pretrained(out)
    print(f"wrote a random-weight {model.config.model_type} of {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"params to {out}")


def _time(fn, n: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def copy_bench(tokens: int, out: str, backend: str = "gloo") -> None:
    """backend gloo: the channel through host memory (ranks may share a GPU), as split training
    runs it by default; nccl: one GPU per rank, the default group on NCCL, record payloads sent
    GPU to GPU over it and the channel's control traffic over a gloo group of the pair (the
    layout that replaced all-NCCL, which hung on two H200s: docs/results/split_h200.md). The
    barrier and all_gather after the channel are NCCL collectives, so a hang would show here."""
    import torch.distributed as dist

    from splitserve.records import HiddenRecord
    from splitserve.stream.channel import ChannelSpec
    from splitserve.stream.p2p import P2PChannel

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    rank = dist.get_rank()
    # nccl: the channel's handshake, headers and credits go over gloo, only payloads over NCCL.
    # Every rank creates the group (new_group is collective), here, before anything else.
    control = dist.new_group([0, 1], backend="gloo") if backend == "nccl" else None
    chan_dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    m, d = 5, 576  # SmolLM2-135M: 5 captured layers of width 576
    results = {"tokens": tokens, "backend": backend}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[1]
        nbytes = tokens * (m + 1) * d * torch.tensor([], dtype=dtype).element_size() + tokens * 9
        row = {"record_bytes": nbytes}
        if rank == 0 and torch.cuda.is_available():
            dev = torch.randn(tokens, (m + 1) * d, device="cuda").to(dtype)
            dev2 = torch.empty_like(dev)
            host = torch.empty(dev.shape, dtype=dtype)
            pinned = torch.empty(dev.shape, dtype=dtype, pin_memory=True)
            b = dev.numel() * dev.element_size()
            row["d2d_GBps"] = 2 * b / _time(lambda: dev2.copy_(dev), 20) / 1e9  # read + write
            row["d2h_pinned_GBps"] = b / _time(lambda: pinned.copy_(dev), 10) / 1e9
            row["h2d_pinned_GBps"] = b / _time(lambda: dev.copy_(pinned), 10) / 1e9
            row["d2h_pageable_GBps"] = b / _time(lambda: host.copy_(dev), 5) / 1e9
            row["h2d_pageable_GBps"] = b / _time(lambda: dev.copy_(host), 5) / 1e9
        # The channel alone: 30 records of `tokens` tokens, credits 4; host buffers under gloo,
        # device buffers (payloads) under nccl.
        spec = ChannelSpec(max_tokens=tokens, aux_dim=m * d, hidden=d, dtype=dtype, credits=4)
        n = 30
        if rank == 0:
            rec = HiddenRecord(0, torch.zeros(tokens, dtype=torch.long, device=chan_dev),
                               torch.ones(tokens, dtype=torch.bool, device=chan_dev),
                               torch.randn(tokens, m * d, device=chan_dev).to(dtype),
                               torch.randn(tokens, d, device=chan_dev).to(dtype))
            ch = P2PChannel(1, "producer", spec, control_group=control, device=chan_dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                ch.send(rec)
            ch.close()
            torch.cuda.synchronize() if backend == "nccl" else None
            row["channel_send_s"] = time.perf_counter() - t0
        else:
            ch = P2PChannel(0, "consumer", spec, control_group=control, device=chan_dev)
            dist.barrier()
            t0 = time.perf_counter()
            got = 0
            while ch.recv() is not None:
                got += 1
            torch.cuda.synchronize() if backend == "nccl" else None
            wall = time.perf_counter() - t0
            row["channel_GBps"] = ch.stats().bytes / wall / 1e9
            row["channel_records_per_s"] = got / wall
            row["channel_tokens_per_s"] = got * tokens / wall
        rows = [None, None]
        dist.all_gather_object(rows, row)
        results[name] = {**rows[0], **rows[1]}
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))
        print(json.dumps(results, indent=1))
    dist.destroy_process_group()


def train_bench(args) -> None:
    from splitserve.config import (
        DataConfig,
        DraftConfig,
        EvalConfig,
        RunConfig,
        SplitConfig,
        TargetConfig,
        TrainConfig,
    )
    from splitserve.split.runner import run_split

    target = TargetConfig(dtype="bfloat16")
    if args.target_path:
        target = TargetConfig(name="smollm2-shape", path=args.target_path, dtype="bfloat16")
    cfg = RunConfig(
        target=target,
        draft=DraftConfig(name=f"dspark_b{args.gamma}", block_size=args.gamma, num_layers=args.layers),
        data=DataConfig(train_path=args.data, max_length=args.tokens),
        train=TrainConfig(max_steps=100000, max_minutes=args.minutes, batch_size=args.batch,
                          anchors_per_seq=args.anchors, lr=6e-4, warmup_steps=20, log_every=10,
                          save_every=100000, backend=args.backend, zero_stage=1, precision="bf16"),
        eval=EvalConfig(enabled=False),
        split=SplitConfig(num_target_ranks=1, wire_dtype=args.wire, credits=args.credits,
                          transport=args.transport),
        run_dir=args.out,
    )
    run_split(cfg)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("long-data")
    a.add_argument("--src", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--tokens", type=int, default=8192)
    a.add_argument("--rows", type=int, default=64)
    a.add_argument("--tokenizer", default=None, help="a model directory (default: the embedded SmolLM2)")
    r = sub.add_parser("shape-target")
    r.add_argument("--like", required=True, help="a directory with config.json and the tokenizer's files")
    r.add_argument("--out", required=True)
    c = sub.add_parser("copy")
    c.add_argument("--tokens", type=int, default=8192)
    c.add_argument("--out", required=True)
    c.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="nccl: one GPU per rank, device-to-device records")
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--tokens", type=int, default=8192)
    t.add_argument("--minutes", type=float, default=2.0)
    t.add_argument("--gamma", type=int, default=8)
    t.add_argument("--layers", type=int, default=5)
    t.add_argument("--anchors", type=int, default=512)
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--wire", default="bfloat16")
    t.add_argument("--credits", type=int, default=4)
    t.add_argument("--backend", default="deepspeed")
    t.add_argument("--transport", choices=("auto", "gloo", "nccl"), default="auto",
                   help="split.transport: nccl needs a GPU per rank (payloads GPU to GPU)")
    t.add_argument("--target-path", default=None,
                   help="a target directory (default: the embedded SmolLM2), e.g. one shape-target wrote")
    args = ap.parse_args()
    if args.mode == "long-data":
        make_long_data(args.src, args.out, args.tokens, args.rows, args.tokenizer)
    elif args.mode == "shape-target":
        shape_target(args.like, args.out)
    elif args.mode == "copy":
        copy_bench(args.tokens, args.out, args.backend)
    else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        train_bench(args)


if __name__ == "__main__":
    main()
