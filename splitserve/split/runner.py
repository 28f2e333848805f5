"""`splitserve train` under torchrun with WORLD_SIZE > 1: one job, two kinds of rank.

    torchrun --nproc-per-node 8 -m splitserve.cli train split=4t4d ...

Target ranks run the frozen target over their share of the data and stream `HiddenRecord`s;
draft ranks receive them and train the draft (plain or DeepSpeed ZeRO over the draft ranks'
own process group). torchrun's RANK / WORLD_SIZE / LOCAL_RANK keep their meaning; the `split`
config only says which ranks do which job. Multi-node is torchrun's rendezvous, unchanged.

Every rank runs a watchdog: if any rank raises or dies, every other rank exits non-zero
within `split.stale_after_s` naming the failed rank and its role.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from splitserve.config import RunConfig
from splitserve.split.routing import Roles, Routing
from splitserve.split.telemetry import ConsumerCounters, ProducerCounters, RateWindow, verdict
from splitserve.split.watchdog import Watchdog
from splitserve.stream.channel import ChannelSpec, ConsumerStopped
from splitserve.stream.p2p import FanInChannel, FanOutChannel
from splitserve.stream.sources import ChannelSource, DataOrder

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


TRANSPORTS = {
    "gloo": "records staged through host memory",
    "nccl": "record payloads GPU to GPU over NCCL, headers and credits over gloo",
}


@dataclass(frozen=True)
class Placement:
    """Where this rank computes and how ranks talk."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device  # model device
    backend: str  # default process group: always gloo (broadcasts, barrier, channel control traffic)
    channel_backend: str  # record payloads: gloo (host-staged) | nccl (GPU to GPU)
    channel_device: torch.device  # where payloads live: host memory under gloo, this rank's GPU under nccl

    @classmethod
    def from_env(cls, transport: str) -> Placement:
        """This rank's placement from torchrun's variables. `auto` asks for NCCL payloads when this
        node has a GPU per rank; `settle_transport` then makes every rank agree."""
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        n_gpu = torch.cuda.device_count()
        cpu = torch.device("cpu")
        if transport not in ("auto", "gloo", "nccl"):
            raise ValueError(f"split.transport must be auto, gloo or nccl, got {transport!r}")
        own_gpus = n_gpu >= local_world
        if transport == "nccl" and not own_gpus:
            raise RuntimeError(
                f"split.transport=nccl needs a GPU per rank: {local_world} ranks on this node, {n_gpu} "
                "GPU(s). Use split.transport=gloo (host-staged) to share GPUs or run without them."
            )
        if n_gpu and own_gpus and transport != "gloo":
            # Payloads GPU to GPU; the channels' headers and credits stay on the default gloo group.
            device = torch.device("cuda", local_rank)
            return cls(rank, world, local_rank, device, "gloo", "nccl", device)
        if n_gpu == 0:
            return cls(rank, world, local_rank, cpu, "gloo", "gloo", cpu)
        # Ranks share GPUs (or gloo was asked for): each computes on a GPU, its own where there
        # are enough, and records are staged through host memory over gloo.
        device = torch.device("cuda", local_rank % n_gpu)
        return cls(rank, world, local_rank, device, "gloo", "gloo", cpu)

    def host_staged(self) -> Placement:
        """The same rank with its records staged through host memory over gloo."""
        return replace(self, channel_backend="gloo", channel_device=torch.device("cpu"))


def settle_transport(place: Placement, transport: str, nccl_everywhere: bool) -> Placement:
    """`auto` uses NCCL payloads only if every rank of the job can (`nccl_everywhere`, agreed over
    the default group): one node with fewer GPUs than ranks sends the whole job back to gloo."""
    if transport == "auto" and place.channel_backend == "nccl" and not nccl_everywhere:
        return place.host_staged()
    return place


def _all_ranks_nccl(place: Placement) -> bool:
    flag = torch.tensor([int(place.channel_backend == "nccl")])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # the default group is gloo: host memory
    return bool(flag.item())


def _channel_kw(place: Placement, payload_group: dist.ProcessGroup | None) -> dict:
    """How this rank's channels are built: everything on the default (gloo) group, or payloads on
    `payload_group` (NCCL) with the default group carrying the control traffic."""
    if payload_group is None:
        return {"device": place.channel_device}
    return {"group": payload_group, "control_group": dist.group.WORLD, "device": place.channel_device}


def _broadcast_ints(values: list[int], src: int) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64)  # the default group is gloo: host memory
    dist.broadcast(t, src=src)
    return [int(v) for v in t.tolist()]


def _read_start(cfg: RunConfig) -> tuple[int, int]:
    """(start step, finished) from the run's latest checkpoint; draft rank 0 reads it."""
    from splitserve.models.run_files import latest_checkpoint
    from splitserve.train.checkpoint import read_state, reopen_if_extended

    ckpt = latest_checkpoint(Path(cfg.run_dir))
    if ckpt is None:
        return 0, 0
    state = read_state(ckpt)
    reopen_if_extended(state, cfg.train.max_steps, cfg.train.max_minutes)  # as the draft ranks' train() will
    return state.step, int(state.finished)


def _spec(cfg: RunConfig, info) -> ChannelSpec:
    if cfg.split.wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"split.wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {cfg.split.wire_dtype!r}")
    return ChannelSpec(
        max_tokens=cfg.split.max_tokens or cfg.data.max_length,
        aux_dim=len(info.layer_ids) * info.hidden_size,
        hidden=info.hidden_size,
        dtype=WIRE_DTYPES[cfg.split.wire_dtype],
        credits=cfg.split.credits,
    )


def run_split(cfg: RunConfig) -> None:
    """Entry point on every rank. Raises (after telling the other ranks) on failure."""
    place = Placement.from_env(cfg.split.transport)
    roles = Roles.resolve(cfg.split, place.world_size)
    if place.device.type == "cuda":
        torch.cuda.set_device(place.device)
    dist.init_process_group(place.backend, timeout=timedelta(minutes=30))
    names = roles.names()
    watchdog = Watchdog(
        dist.distributed_c10d._get_default_store(),
        place.rank,
        place.world_size,
        names,
        interval_s=cfg.split.heartbeat_s,
        stale_after_s=cfg.split.stale_after_s,
    ).start()
    try:
        place = settle_transport(place, cfg.split.transport, _all_ranks_nccl(place))
        if place.rank == 0:
            print(f"[split] {roles.describe()}: target ranks {list(roles.target_ranks)}, draft ranks "
                  f"{list(roles.draft_ranks)}; {place.channel_backend} transport "
                  f"({TRANSPORTS[place.channel_backend]})", flush=True)
        # Every rank takes part in creating every group, in the same order. The draft ranks
        # reduce gradients over NCCL whenever each has a GPU of its own, even when the target
        # ranks share GPUs with them (and so talk to them over gloo).
        gpus = torch.cuda.device_count()
        own_gpus = place.device.type == "cuda" and gpus >= len(roles.draft_ranks)
        draft_backend = "nccl" if own_gpus else "gloo"
        draft_group = dist.new_group(list(roles.draft_ranks), backend=draft_backend)
        # NCCL payloads: one group of every rank (each pair gets its own communicator, which the
        # channel opens at connect); control traffic stays on the default gloo group.
        payload_group = dist.new_group(backend="nccl") if place.channel_backend == "nccl" else None
        chan_kw = _channel_kw(place, payload_group)
        own_group = None
        if cfg.train.backend == "deepspeed":
            from splitserve.train.backends import singleton_groups

            own_group = singleton_groups(draft_backend)
        start, finished = _read_start(cfg) if place.rank == roles.draft_ranks[0] else (0, 0)
        start, finished = _broadcast_ints([start, finished], roles.draft_ranks[0])
        cfg = replace(cfg, train=replace(cfg.train, device=str(place.device)),
                      target=replace(cfg.target, device=str(place.device)))
        if roles.role_of(place.rank) == "target":
            _target_rank(cfg, roles, place, watchdog, chan_kw, start, finished)
        else:
            reduce_device = place.device if draft_backend == "nccl" else torch.device("cpu")
            _draft_rank(cfg, roles, place, watchdog, chan_kw, draft_group, own_group, reduce_device, start,
                        finished)
        dist.barrier()  # nobody leaves (taking the store with it) while a peer still evaluates
        watchdog.stop()
    except BaseException as exc:
        traceback.print_exc()
        watchdog.fail(exc)
        sys.stderr.flush()
        os._exit(1)  # never hang in a collective the failed peers will not join
    dist.destroy_process_group()


def _target_rank(
    cfg: RunConfig, roles: Roles, place: Placement, watchdog: Watchdog, chan_kw: dict, start: int, finished: int
) -> None:
    from splitserve.target import load_target
    from splitserve.target.capture_check import check_capture_varies
    from splitserve.train.loop import build_source

    t_index = roles.target_ranks.index(place.rank)
    target = load_target(cfg.target, place.device)
    if not cfg.data.dump_dir:  # the records it sends are its own captures
        check_capture_varies(target)
    source = build_source(cfg, target, quiet=t_index != 0, store_dtype=WIRE_DTYPES[cfg.split.wire_dtype])
    n = _broadcast_ints([source.num_samples], roles.target_ranks[0])[0]
    spec = _spec(cfg, target.info)
    fan = FanOutChannel.connect(list(roles.draft_ranks), spec, **chan_kw)
    order = DataOrder(n, cfg.train.batch_size, cfg.train.seed)
    routing = Routing(order, len(roles.target_ranks), len(roles.draft_ranks))
    counters = ProducerCounters()
    t0 = time.perf_counter()
    last_publish = 0.0
    stop = start if finished else cfg.train.max_steps
    try:
        # One step's samples of this rank are captured together (a bucketed capture runs a
        # length bucket's samples in one forward), then sent in the routing's order.
        for _, items in itertools.groupby(routing.producer_items(t_index, start, stop), key=lambda it: it[0]):
            items = list(items)
            tc = time.perf_counter()
            records = source.get([sample for _, _, sample in items])
            if place.device.type == "cuda":
                # The capture's stream only: a whole-device synchronize would also wait for this
                # rank's NCCL payload sends in flight, i.e. for their consumers to post receives.
                torch.cuda.current_stream(place.device).synchronize()
            counters.capture_s += time.perf_counter() - tc
            for (_, j, _), record in zip(items, records):
                fan.channels[j].send(record)
                counters.samples += 1
                counters.tokens += record.num_tokens
                now = time.perf_counter()
                if now - last_publish > 0.5:
                    _publish(watchdog, fan, counters, now - t0, place.device)
                    last_publish = now
    except ConsumerStopped:
        pass  # the trainers finished early (time budget); close() below ends every stream
    fan.close()
    _publish(watchdog, fan, counters, time.perf_counter() - t0, place.device)
    print(f"[split] target rank {place.rank}: produced {counters.samples} samples, {counters.tokens:,} tokens; "
          f"capture {counters.capture_s:.1f} s, blocked on credits {counters.send_wait_s:.1f} s "
          f"of {counters.wall_s:.1f} s", flush=True)


def _peak_mem_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def _publish(watchdog: Watchdog, fan: FanOutChannel, counters: ProducerCounters, wall_s: float,
             device: torch.device) -> None:
    st = fan.stats()
    counters.bytes, counters.send_wait_s, counters.wall_s = st.bytes, st.send_wait_s, wall_s
    counters.peak_mem_gib = _peak_mem_gib(device)
    counters.in_flight = sum(ch.in_flight for ch in fan.channels)
    watchdog.publish(counters.as_dict())


def _draft_rank(cfg, roles: Roles, place: Placement, watchdog: Watchdog, chan_kw: dict, draft_group, own_group,
                reduce_device: torch.device, start: int, finished: int) -> None:
    from splitserve.evaluation.heldout import evaluate_run
    from splitserve.target.hf import load_hf_target
    from splitserve.target.shared_weights import SharedWeightsTarget
    from splitserve.train.loop import train
    from splitserve.train.partition import Partition

    d_index = roles.draft_ranks.index(place.rank)
    part = Partition(
        index=d_index,
        size=len(roles.draft_ranks),
        group=draft_group,
        device=reduce_device,
        own_group=own_group,
    )
    # The draft copies the target's embedding and lm_head in at build time and uses nothing else
    # of it while training: only those two tensors are read from the checkpoint (an 8B target
    # would otherwise cost its full size on every draft rank). Rank 0 loads the whole target
    # for the held-out evaluation only.
    target = SharedWeightsTarget(cfg.target)
    n = _broadcast_ints([0], roles.target_ranks[0])[0]
    spec = _spec(cfg, target.info)
    n_t = len(roles.target_ranks)
    routing = Routing(DataOrder(n, cfg.train.batch_size, cfg.train.seed), n_t, len(roles.draft_ranks))
    first = routing.first_producer(start)
    producers = [roles.target_ranks[(first + i) % n_t] for i in range(n_t)]
    fan = FanInChannel.connect(producers, spec, **chan_kw)
    source = ChannelSource(fan, n, prefetch=cfg.split.prefetch)
    window = RateWindow(n_draft=part.size, n_target=n_t)
    t_train = time.perf_counter()

    def consumed() -> ConsumerCounters:
        st = fan.stats()
        s = part.sum([source.records, source.tokens, st.bytes, source.wait_s])
        return ConsumerCounters(int(s[0]), int(s[1]), int(s[2]), s[3])

    def telemetry(wall_s: float) -> dict:
        c = consumed()  # collective: every draft rank calls it at the same step
        produced = {r: s for r in roles.target_ranks if (s := watchdog.peer_status(r))}
        return window.rates(wall_s, c, produced)

    result = train(cfg, target, source=source, part=part, telemetry=telemetry)
    wall = time.perf_counter() - t_train
    total = consumed()
    source.close()
    fan.close()
    if part.writer:
        time.sleep(2 * cfg.split.heartbeat_s)  # let the producers' last counters land
        produced = [s for r in roles.target_ranks if (s := watchdog.peer_status(r))]
        p_wait = sum(p["send_wait_s"] for p in produced) / max(sum(p["wall_s"] for p in produced), 1e-9)
        v = verdict(total.recv_wait_s / (wall * part.size), p_wait, n_t, part.size)
        summary = {
            "split": f"{n_t}+{part.size}",
            "steps": result.state.step,
            "wall_s": wall,
            "consumed_samples": total.samples,
            "consumed_tokens": total.tokens,
            "consumed_tokens_per_s": total.tokens / wall,
            "channel_bytes": total.bytes,
            "channel_bytes_per_s": total.bytes / wall,
            "draft_rank0_peak_mem_gib": _peak_mem_gib(place.device),
            "producers": produced,
            "verdict": v.as_dict(),
        }
        Path(cfg.run_dir, "split_summary.json").write_text(json.dumps(summary, indent=1))
        print(f"[split] {n_t}+{part.size}: {result.state.step} steps, {total.tokens:,} tokens consumed at "
              f"{total.tokens / wall:,.0f} tok/s, channel {total.bytes / wall / 1e6:,.1f} MB/s; "
              f"trainer wait {v.trainer_wait_fraction:.1%}, producer wait {v.producer_wait_fraction:.1%}\n"
              f"[split] {v.advice}", flush=True)
        if cfg.eval.enabled:
            evaluate_run(cfg, load_hf_target(cfg.target, place.device), result.draft)
