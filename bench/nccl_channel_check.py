"""Two-GPU check of the split channel with payloads on NCCL and control traffic on gloo.

    torchrun --standalone --nproc-per-node 2 bench/nccl_channel_check.py channel
    torchrun --standalone --nproc-per-node 2 bench/nccl_channel_check.py train nccl RUN_NCCL
    torchrun --standalone --nproc-per-node 2 bench/nccl_channel_check.py train gloo RUN_GLOO
    python bench/nccl_channel_check.py compare RUN_NCCL RUN_GLOO

`channel` uses the runner's layout (default group gloo, one NCCL group for payloads) and checks,
on rank 1, that every record arrives bit-exact:
  1. around NCCL barriers right after the channel opens (where the all-NCCL channel hung);
  2. with the consumer receiving in a thread while its main thread multiplies and all-reduces
     on another NCCL group, as a draft rank with prefetch does;
  3. a consumer that stops early, a producer that fails (ERROR with its text), fan in/out.
`train` runs `run_split` on a tiny random target (1 target + 1 draft rank, 8 steps) with the
given split.transport; `compare` asserts the two runs logged the same losses.
With DRY=1 `channel` runs on CPU with gloo for both planes (a smoke run without GPUs).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from splitserve.records import HiddenRecord  # noqa: E402
from splitserve.stream import (  # noqa: E402
    ChannelSpec,
    ConsumerStopped,
    FanInChannel,
    FanOutChannel,
    P2PChannel,
    ProducerError,
)

D, M, T = 64, 3, 512  # hidden, captured layers, max tokens per record
LENGTHS = [5, 0, 512, 1, 300, 17, 512, 2] * 4  # record lengths, the empty one included


def record(i: int, t: int, device) -> HiddenRecord:
    """Record i of t tokens, the same on both ranks (seeded by i)."""
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 50_000, (t,), generator=g)  # (t,)
    mask = torch.rand(t, generator=g) < 0.5  # (t,)
    aux, final = torch.randn(t, M * D, generator=g), torch.randn(t, D, generator=g)  # (t, M*D), (t, D)
    return HiddenRecord(i, ids.to(device), mask.to(device), aux.to(device), final.to(device))


def exact(got: HiddenRecord, i: int, t: int, dtype: torch.dtype, device) -> bool:
    want = record(i, t, "cpu")
    pairs = [(got.input_ids, want.input_ids), (got.loss_mask, want.loss_mask),
             (got.aux, want.aux.to(dtype)), (got.final, want.final.to(dtype))]
    return got.sample_id == i and got.aux.device.type == device.type and all(
        torch.equal(a.cpu(), b) for a, b in pairs)


def spec(dtype: torch.dtype, credits: int = 3) -> ChannelSpec:
    return ChannelSpec(max_tokens=T, aux_dim=M * D, hidden=D, dtype=dtype, credits=credits)


def check_channel() -> None:
    faulthandler.dump_traceback_later(150, exit=True)  # a hang prints every thread's stack
    rank = int(os.environ["RANK"])
    dry = os.environ.get("DRY") == "1"
    dev = torch.device("cpu") if dry else torch.device("cuda", rank)
    backend = "gloo" if dry else "nccl"
    if not dry:
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo")  # control plane, as in the split runner
    data = dist.new_group(backend=backend)  # payload plane
    solo = [dist.new_group([r], backend=backend) for r in range(2)]
    kw = dict(group=data, control_group=dist.group.WORLD, device=dev)
    ok: list[bool] = []
    n = 256 if dry else 2048  # side of the matrices the other work multiplies

    # 1. exact round trips, with NCCL collectives right after the channel opens
    for tag, dt in ((1, torch.float32), (2, torch.bfloat16)):
        if rank == 0:
            ch = P2PChannel(1, "producer", spec(dt), tag=tag, **kw)
            dist.barrier(group=data)
            for i, t in enumerate(LENGTHS):
                ch.send(record(i, t, dev))
            ch.close()
        else:
            ch = P2PChannel(0, "consumer", spec(dt), tag=tag, **kw)
            dist.barrier(group=data)
            got = list(iter(ch.recv, None))
            ok.append(len(got) == len(LENGTHS) and all(exact(r, i, t, dt, dev) for r, (i, t) in
                                                       zip(got, enumerate(LENGTHS))))
        dist.barrier(group=data)
        dist.barrier()
    print(f"rank {rank}: 1 (exact, around NCCL barriers) {ok}", flush=True)

    # 2. a consumer thread receiving beside compute and all-reduces on another NCCL group
    count = 64
    x = torch.randn(n, n, device=dev)
    if rank == 0:
        ch = P2PChannel(1, "producer", spec(torch.bfloat16, 2), tag=3, **kw)
        for i in range(count):
            y = x @ x  # stands in for the target's capture
            torch.cuda.current_stream().synchronize() if dev.type == "cuda" else None
            ch.send(record(i, LENGTHS[i % len(LENGTHS)], dev))
        ch.close()
    else:
        ch = P2PChannel(0, "consumer", spec(torch.bfloat16, 2), tag=3, **kw)
        got = []
        th = threading.Thread(target=lambda: got.extend(iter(ch.recv, None)))
        th.start()
        for _ in range(200):
            y = x @ x  # stands in for the draft step and its gradient all-reduce
            dist.all_reduce(y, group=solo[rank])
        th.join()
        ok.append(len(got) == count and all(exact(r, i, LENGTHS[i % len(LENGTHS)], torch.bfloat16, dev)
                                            for i, r in enumerate(got)))
    dist.barrier(group=data)
    print(f"rank {rank}: 2 (threaded consumer beside all-reduces) {ok}", flush=True)

    # 3. early stop, ERROR, fan in/out
    f32 = spec(torch.float32)
    if rank == 0:
        with P2PChannel(1, "producer", f32, tag=4, **kw) as ch:
            try:
                for i in range(200):
                    ch.send(record(i, 64, dev))
            except ConsumerStopped:
                pass
        ch = P2PChannel(1, "producer", f32, tag=5, **kw)
        ch.send(record(7, 9, dev))
        ch.fail("target crashed")
        with FanOutChannel.connect([1], f32, tag=6, **kw) as fan:
            for i in range(5):
                fan.send(record(i, 33, dev))
    else:
        ch = P2PChannel(0, "consumer", f32, tag=4, **kw)
        early = [ch.recv() for _ in range(5)]
        ch.close()
        ok.append(all(exact(r, i, 64, torch.float32, dev) for i, r in enumerate(early)))
        ch = P2PChannel(0, "consumer", f32, tag=5, **kw)
        ok.append(exact(ch.recv(), 7, 9, torch.float32, dev))
        try:
            ch.recv()
            ok.append(False)
        except ProducerError as e:
            ok.append("target crashed" in str(e))
        with FanInChannel.connect([0], f32, tag=6, **kw) as fan:
            got = list(iter(fan.recv, None))
        ok.append(len(got) == 5 and all(exact(r, i, 33, torch.float32, dev) for i, r in enumerate(got)))
    dist.barrier(group=data)
    dist.barrier()
    if rank == 1:
        print(f"rank 1: {'ALL OK' if all(ok) else 'FAILED'} {ok}", flush=True)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    if rank == 1 and not all(ok):
        sys.exit(1)


def check_train(transport: str, run_dir: str) -> None:
    """8 steps of run_split on a tiny random target with this split.transport."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny import save_tiny_smol

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

    # Rank 0 saves the target beside the run and renames it into place once complete, so the
    # other rank, which polls for the directory, never reads a half-written one.
    target_dir = Path(run_dir + "_target")
    if int(os.environ["RANK"]) == 0 and not target_dir.exists():
        partial = Path(save_tiny_smol(Path(run_dir + "_target.partial")))
        partial.rename(target_dir)
    while not target_dir.exists():
        threading.Event().wait(0.2)
    cfg = RunConfig(
        target=TargetConfig(path=str(target_dir), name="tiny-smol", layer_ids=[0, 1, 2]),
        data=DataConfig(train_path=str(REPO / "data/sample_chat.jsonl"),
                        heldout_prompts=str(REPO / "data/sample_prompts.jsonl"), max_length=64),
        draft=DraftConfig(num_layers=1, intermediate_size=32, markov_rank=4),
        train=TrainConfig(max_steps=8, batch_size=4, anchors_per_seq=4, log_every=1, save_every=100),
        eval=EvalConfig(enabled=False),
        split=SplitConfig(num_target_ranks=1, transport=transport, heartbeat_s=0.2),
        run_dir=run_dir,
    )
    run_split(cfg)


def compare(run_a: str, run_b: str) -> None:
    a = [json.loads(x) for x in open(Path(run_a) / "metrics.jsonl")]
    b = [json.loads(x) for x in open(Path(run_b) / "metrics.jsonl")]
    diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    same = [m["step"] for m in a] == [m["step"] for m in b]
    print(f"steps equal: {same}; losses {[round(m['loss'], 6) for m in a]}; max |difference| {diff}")
    if not same or diff > 0:
        sys.exit(1)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "channel":
        check_channel()
    elif mode == "train" and len(sys.argv) == 4:
        check_train(sys.argv[2], sys.argv[3])
    elif mode == "compare" and len(sys.argv) == 4:
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
