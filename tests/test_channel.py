"""Split-training transport: the wire format, credit flow control, and real gloo runs between
processes (producer -> consumer, two producers -> one consumer, one producer -> two consumers)."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from splitserve.records import SCHEMA_VERSION, HiddenRecord, TargetInfo
from splitserve.stream import (
    ChannelMismatch,
    ChannelSpec,
    ChannelStats,
    ConsumerStopped,
    DumpReader,
    DumpWriter,
    FanInChannel,
    FanOutChannel,
    Header,
    Kind,
    LocalChannel,
    P2PChannel,
    ProducerError,
    WireError,
    WireVersionError,
    decode,
    encode,
)
from splitserve.stream.sources import DumpSource

D, M = 8, 2  # hidden width, captured layers: aux is (T, M*D)
MAX_TOKENS = 32
# Varying lengths, with the edge cases: an empty record and one that fills the buffer exactly.
LENGTHS = [5, 17, 0, 32, 1, 9, 30, 2, 14, 7, 25, 3, 32, 11, 6, 19, 4, 28, 8, 13]


def make_record(sample_id: int, t: int) -> HiddenRecord:
    """Deterministic in (sample_id, t), so every process can rebuild what the other sent."""
    g = torch.Generator().manual_seed(1000 + sample_id)
    return HiddenRecord(
        sample_id=sample_id,
        input_ids=torch.randint(0, 50_000, (t,), generator=g),
        loss_mask=torch.rand(t, generator=g) < 0.5,
        aux=torch.randn(t, M * D, generator=g),
        final=torch.randn(t, D, generator=g),
    )


def same_record(got: HiddenRecord, want: HiddenRecord, dtype: torch.dtype) -> bool:
    # bit-equal: the wire carries bytes, and both sides' bf16 casts are correctly rounded (RNE)
    return (
        got.sample_id == want.sample_id
        and got.input_ids.dtype == torch.int64
        and torch.equal(got.input_ids, want.input_ids)
        and got.loss_mask.dtype == torch.bool
        and torch.equal(got.loss_mask, want.loss_mask)
        and got.aux.dtype == dtype
        and torch.equal(got.aux, want.aux.to(dtype))
        and got.final.dtype == dtype
        and torch.equal(got.final, want.final.to(dtype))
    )


def spec(dtype: torch.dtype = torch.float32, credits: int = 3) -> ChannelSpec:
    return ChannelSpec(max_tokens=MAX_TOKENS, aux_dim=M * D, hidden=D, dtype=dtype, credits=credits)


# ---- wire -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [0, 1, 13])
def test_wire_round_trip(dtype: torch.dtype, t: int) -> None:
    want = make_record(7, t)
    header, payload = encode(want, dtype)
    again = Header.from_tensor(header.to_tensor())
    assert again == header and again.kind == Kind.RECORD and again.num_tokens == t
    assert [p.dtype for p in payload] == [torch.int64, torch.uint8, dtype, dtype]
    # bf16 is exactly the cast (no other rounding on the way); fp32 is bit-exact.
    assert same_record(decode(again, payload), want, dtype)


def test_wire_rejects_other_versions_and_garbage() -> None:
    header = Header(kind=Kind.END).to_tensor()
    other = header.clone()
    other[1] = SCHEMA_VERSION + 1
    both = rf"schema_version {SCHEMA_VERSION + 1}.*schema_version {SCHEMA_VERSION}"
    with pytest.raises(WireVersionError, match=both):
        Header.from_tensor(other)
    bad = header.clone()
    bad[0] = 12345
    with pytest.raises(WireError, match="magic"):
        Header.from_tensor(bad)
    with pytest.raises(ValueError, match="float16"):
        encode(make_record(1, 3), torch.float16)


def test_spec_refuses_records_the_consumer_cannot_hold() -> None:
    s = spec()
    s.check_record(make_record(1, MAX_TOKENS))
    with pytest.raises(ValueError, match=f"33 tokens.*max_tokens={MAX_TOKENS}"):
        s.check_record(make_record(1, MAX_TOKENS + 1))
    narrow = make_record(2, 4)
    narrow.final = narrow.final[:, :4]
    with pytest.raises(ValueError, match="record 2"):
        s.check_record(narrow)


def test_stats_combine() -> None:
    a = ChannelStats(records=2, bytes=10, send_wait_s=0.5, recv_wait_s=0.0, max_in_flight=3)
    b = ChannelStats(records=1, bytes=5, send_wait_s=0.25, recv_wait_s=1.0, max_in_flight=2)
    assert ChannelStats.combine([a, b]).as_dict() == {
        "records": 3, "bytes": 15, "send_wait_s": 0.75, "recv_wait_s": 1.0, "max_in_flight": 3
    }


# ---- in-process channels ----------------------------------------------------------------


def _produce(ch: LocalChannel, ids: list[int], outcome: dict) -> None:
    try:
        for i in ids:
            ch.send(make_record(i, 4))
        ch.close()
        outcome["ok"] = True
    except ConsumerStopped:
        outcome["stopped"] = True


def test_local_channel_blocks_a_producer_ahead_of_a_slow_consumer() -> None:
    ch = LocalChannel(credits=3)
    outcome: dict = {}
    producer = threading.Thread(target=_produce, args=(ch, list(range(12)), outcome))
    producer.start()
    got = []
    while (r := ch.recv()) is not None:
        time.sleep(0.01)  # a slow consumer: the producer must wait, not queue everything
        got.append(r.sample_id)
    producer.join(timeout=10)
    assert not producer.is_alive() and outcome == {"ok": True}
    assert got == list(range(12)) and ch.recv() is None
    s = ch.stats()
    assert s.records == 12 and s.max_in_flight <= 3 and s.send_wait_s > 0


def test_local_channel_stop_error_and_several_producers() -> None:
    ch = LocalChannel(credits=2)
    outcome: dict = {}
    producer = threading.Thread(target=_produce, args=(ch, list(range(100)), outcome))
    producer.start()
    assert ch.recv() is not None
    ch.stop()  # the consumer is done early: the blocked producer is released and told
    producer.join(timeout=10)
    assert not producer.is_alive() and outcome == {"stopped": True}

    ch = LocalChannel(credits=2, producers=2)
    outcomes: list[dict] = [{}, {}]
    threads = [
        threading.Thread(target=_produce, args=(ch, ids, o)) for ids, o in zip([[1, 2], [3, 4, 5]], outcomes)
    ]
    for th in threads:
        th.start()
    got = []
    while (r := ch.recv()) is not None:
        got.append(r.sample_id)
    for th in threads:
        th.join(timeout=10)
    assert sorted(got) == [1, 2, 3, 4, 5]

    ch = LocalChannel()
    ch.send(make_record(1, 2))
    ch.fail("target ran out of memory")
    assert ch.recv().sample_id == 1
    with pytest.raises(ProducerError, match="out of memory"):
        ch.recv()


def test_dump_source_yields_a_dump_in_the_given_order(tmp_path: Path) -> None:
    """A dump reaches the trainer through the same consumer interface as a channel (RecordSource.get)."""
    target = TargetInfo(name="tiny", vocab_size=50_000, hidden_size=D, num_layers=4, layer_ids=(1, 2))
    records = [make_record(i, t) for i, t in enumerate([3, 5, 2, 6])]
    with DumpWriter(tmp_path, target, torch.bfloat16, shard_tokens=6) as w:
        for r in records:
            w.add(r)
    source = DumpSource(DumpReader(tmp_path))
    assert source.num_samples == 4
    got = source.get([2, 0, 3])
    assert [g.sample_id for g in got] == [2, 0, 3]
    assert all(same_record(g, records[i], torch.bfloat16) for g, i in zip(got, [2, 0, 3]))


# ---- gloo, several processes --------------------------------------------------------------

RUN_TIMEOUT_S = 60.0  # a hung rank is killed after this and the test fails; a pass takes seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        # A short collective timeout: a protocol bug ends in an error, not a silent hang.
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
        try:
            results.put((rank, "ok", fn(rank)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, world: int) -> dict:
    """Run fn(rank) in `world` fresh processes joined by a gloo group; their return values."""
    # forkserver: like spawn, no rank inherits this process's threads or state, but the server
    # imports the heavy modules (torch, splitserve) once and forks every rank from there,
    # instead of each rank spending seconds on the same imports.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "splitserve.split", "splitserve.stream", "pytest"])
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, port, results), daemon=True) for r in range(world)
    ]
    for p in procs:
        p.start()
    done: dict = {}
    errors: dict = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while len(done) + len(errors) < world and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.5)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break  # every process is gone without reporting
                continue
            (done if status == "ok" else errors)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    if errors:
        pytest.fail("\n".join(f"rank {r} failed:\n{tb}" for r, tb in sorted(errors.items())))
    missing = sorted(set(range(world)) - set(done))
    if missing:
        pytest.fail(f"ranks {missing} did not finish within {RUN_TIMEOUT_S:.0f}s")
    return done


def _send_until_stopped(ch: P2PChannel, out: dict) -> None:
    """Producer side of the early-stop scenario: send until the consumer stops the channel;
    send() raises ConsumerStopped and close() (the with block) still ends cleanly."""
    sent = 0
    with ch:
        try:
            for k in range(200):
                ch.send(make_record(k, 4))
                sent += 1
        except ConsumerStopped:
            out["stopped_after"] = sent


def _recv_bf16_then_error(ch: P2PChannel, out: dict) -> None:
    """Consumer end of the phase where the producer sends records 50 (6 tokens) and 51 (empty)
    in bf16, then fails: out["bf16_ok"], and out["error"] once recv() raises ProducerError."""
    a, b = ch.recv(), ch.recv()
    out["bf16_ok"] = same_record(a, make_record(50, 6), torch.bfloat16) and same_record(
        b, make_record(51, 0), torch.bfloat16
    )
    try:
        ch.recv()
    except ProducerError as e:
        out["error"] = str(e)


def _pair_ranks(rank: int) -> dict:
    """Rank 0 produces, rank 1 consumes; four channels between them, one per phase (by tag)."""
    out: dict = {}
    if rank == 0:
        # Ends that disagree both refuse, and leave nothing pending behind them.
        try:
            P2PChannel(1, "producer", spec(credits=3), tag=0)
        except ChannelMismatch as e:
            out["mismatch"] = str(e)
        # In-order delivery of varying lengths, behind a slow consumer.
        ch = P2PChannel(1, "producer", spec(), tag=1)
        try:
            ch.send(make_record(999, MAX_TOKENS + 1))
        except ValueError as e:
            out["too_long"] = str(e)
        for k, t in enumerate(LENGTHS):
            ch.send(make_record(k, t))
        ch.close()
        out["stats"] = ch.stats().as_dict()
        # The consumer stops early: send() raises, close() still ends cleanly.
        _send_until_stopped(P2PChannel(1, "producer", spec(), tag=2), out)
        # bf16 on the wire from a slow producer, then a producer failure.
        ch = P2PChannel(1, "producer", spec(torch.bfloat16), tag=3)
        time.sleep(0.3)  # the consumer is already waiting: this must show as its recv_wait_s
        ch.send(make_record(50, 6))
        ch.send(make_record(51, 0))
        ch.fail("target crashed")
        return out

    try:
        P2PChannel(0, "consumer", spec(credits=4), tag=0)
    except ChannelMismatch as e:
        out["mismatch"] = str(e)
    ch = P2PChannel(0, "consumer", spec(), tag=1)
    ids, bad = [], []
    while (r := ch.recv()) is not None:
        time.sleep(0.02)  # slower than the producer, so its credits run out
        if not same_record(r, make_record(r.sample_id, LENGTHS[r.sample_id]), torch.float32):
            bad.append(r.sample_id)
        ids.append(r.sample_id)
    out.update(ids=ids, bad=bad, again_none=ch.recv() is None, stats=ch.stats().as_dict())
    ch.close()

    ch = P2PChannel(0, "consumer", spec(), tag=2)
    out["early"] = [ch.recv().sample_id for _ in range(5)]
    ch.close()
    out["none_after_close"] = ch.recv() is None

    ch = P2PChannel(0, "consumer", spec(torch.bfloat16), tag=3)
    _recv_bf16_then_error(ch, out)
    out["slow_producer_wait_s"] = ch.stats().recv_wait_s
    return out


def test_p2p_gloo_producer_to_consumer() -> None:
    res = run_ranks(_pair_ranks, 2)
    prod, cons = res[0], res[1]
    assert "credits" in prod["mismatch"] and "credits" in cons["mismatch"]
    assert "max_tokens=32" in prod["too_long"]
    # Every record arrives intact, in order, once; then None, and None again.
    assert cons["ids"] == list(range(len(LENGTHS))) and cons["bad"] == [] and cons["again_none"]
    ps, cs = prod["stats"], cons["stats"]
    assert ps["records"] == cs["records"] == len(LENGTHS) and ps["bytes"] == cs["bytes"]
    # The credit bound holds, and is reached: the slow consumer made the producer wait.
    assert ps["max_in_flight"] == 3 and ps["send_wait_s"] > 0
    assert cs["recv_wait_s"] >= 0 and cs["max_in_flight"] == 0
    # Early stop: the producer learns within a credit window of sends, both ends shut down.
    assert cons["early"] == [0, 1, 2, 3, 4] and cons["none_after_close"]
    assert 5 <= prod["stopped_after"] <= 5 + 3 + 1
    assert cons["bf16_ok"] and "producer rank 0 failed: target crashed" in cons["error"]
    assert cons["slow_producer_wait_s"] >= 0.2


def _fan_ranks(rank: int) -> dict:
    """Phase 1: ranks 0 and 1 produce, rank 2 consumes through a FanInChannel.
    Phase 2: rank 0 produces through a FanOutChannel, ranks 1 and 2 consume."""
    counts = {0: 6, 1: 9}  # uneven, so one producer ends while the other still sends
    out: dict = {}
    if rank in counts:
        with P2PChannel(2, "producer", spec(), tag=0) as ch:
            for k in range(counts[rank]):
                sid = rank * 100 + k
                ch.send(make_record(sid, LENGTHS[sid % 100]))
    else:
        with FanInChannel.connect([0, 1], spec(), tag=0) as ch:
            ids, bad = [], []
            while (r := ch.recv()) is not None:
                ids.append(r.sample_id)
                if not same_record(r, make_record(r.sample_id, LENGTHS[r.sample_id % 100]), torch.float32):
                    bad.append(r.sample_id)
            out.update(fan_in=ids, bad=bad, stats=ch.stats().as_dict())

    if rank == 0:
        with FanOutChannel.connect([1, 2], spec(), tag=1) as ch:
            for k in range(7):
                ch.send(make_record(k, 3))
        out["fan_out_stats"] = ch.stats().as_dict()
    else:
        with P2PChannel(0, "consumer", spec(), tag=1) as ch:
            out["fan_out"] = [r.sample_id for r in iter(ch.recv, None)]
    return out


def test_fan_in_and_fan_out_over_gloo() -> None:
    res = run_ranks(_fan_ranks, 3)
    got = res[2]["fan_in"]
    # Exactly once each, round-robin while both producers run, then the longer one alone.
    assert got == [0, 100, 1, 101, 2, 102, 3, 103, 4, 104, 5, 105, 106, 107, 108]
    assert res[2]["bad"] == [] and res[2]["stats"]["records"] == 15
    assert res[1]["fan_out"] == [0, 2, 4, 6] and res[2]["fan_out"] == [1, 3, 5]
    assert res[0]["fan_out_stats"]["records"] == 7


# ---- two planes: control on one group, payloads on another ----------------------------------


def test_p2p_payloads_on_a_gpu_need_a_control_group() -> None:
    # Refused before any call: headers and credits on NCCL are what hung on two H200s.
    with pytest.raises(ValueError, match="needs a control_group"):
        P2PChannel(1, "producer", spec(), device="cuda")


class _Tracked:
    """A payload-group call's Work, noting whether the channel waited for it."""

    def __init__(self, work: dist.Work) -> None:
        self.work, self.done = work, False

    def wait(self) -> bool:
        out = self.work.wait()
        self.done = True
        return out

    def is_completed(self) -> bool:
        return self.work.is_completed()


class _CallLog:
    """Every point-to-point call made in this process from now on, in order, as
    (plane, op, dtype, numel, value of a one-element control send), plane naming its group."""

    def __init__(self, planes: dict[int, str]) -> None:  # id(group) -> name
        self.planes = planes
        self.calls: list[tuple] = []
        self.payload_works: list[_Tracked] = []
        for op in ("isend", "irecv", "send", "recv"):
            setattr(dist, op, self._wrap(op, getattr(dist, op)))

    def _wrap(self, op: str, fn):
        def call(tensor: torch.Tensor, *args, group=None, **kw):
            plane = self.planes.get(id(group), "other")
            value = int(tensor) if plane == "control" and op.endswith("send") and tensor.numel() == 1 else None
            self.calls.append((plane, op, str(tensor.dtype).split(".")[1], tensor.numel(), value))
            out = fn(tensor, *args, group=group, **kw)
            if plane == "payload":
                out = _Tracked(out)
                self.payload_works.append(out)
            return out

        return call

    def pending(self) -> int:
        """Payload-group calls the channel has not waited for."""
        return sum(not w.done for w in self.payload_works)


def _planes_ranks(rank: int) -> dict:
    """Rank 0 produces, rank 1 consumes, payloads on one gloo group and control traffic on
    another; each phase (by tag) logs its own calls."""
    ctl = dist.new_group([0, 1], backend="gloo")
    data = dist.new_group([0, 1], backend="gloo")
    log = _CallLog({id(ctl): "control", id(data): "payload"})
    kw = dict(group=data, control_group=ctl)
    out: dict = {}
    mark = 0

    def phase(name: str) -> None:
        nonlocal mark
        out[name + "_calls"], mark = log.calls[mark:], len(log.calls)
        out[name + "_pending"] = log.pending()

    if rank == 0:
        try:
            P2PChannel(1, "producer", spec(credits=3), tag=0, **kw)
        except ChannelMismatch:
            phase("mismatch")
        ch = P2PChannel(1, "producer", spec(), tag=1, **kw)
        for k, t in enumerate(LENGTHS):
            ch.send(make_record(k, t))
        ch.close()
        out["stats"] = ch.stats().as_dict()
        phase("records")
        _send_until_stopped(P2PChannel(1, "producer", spec(), tag=2, **kw), out)
        phase("stop")
        ch = P2PChannel(1, "producer", spec(torch.bfloat16), tag=3, **kw)
        ch.send(make_record(50, 6))
        ch.send(make_record(51, 0))
        ch.fail("target crashed")
        phase("error")
        with FanOutChannel.connect([1], spec(), tag=4, **kw) as fan:
            for k in range(3):
                fan.send(make_record(k, LENGTHS[k]))
        phase("fan")
        return out

    try:
        P2PChannel(0, "consumer", spec(credits=4), tag=0, **kw)
    except ChannelMismatch:
        phase("mismatch")
    ch = P2PChannel(0, "consumer", spec(), tag=1, **kw)
    ids, bad, pending = [], [], []
    while (r := ch.recv()) is not None:
        time.sleep(0.01)  # slower than the producer, so its credits run out
        pending.append(log.pending())  # every payload receive is done when recv() returns
        if not same_record(r, make_record(r.sample_id, LENGTHS[r.sample_id]), torch.float32):
            bad.append(r.sample_id)
        ids.append(r.sample_id)
    out.update(ids=ids, bad=bad, pending_after_recv=pending, stats=ch.stats().as_dict())
    ch.close()
    phase("records")
    ch = P2PChannel(0, "consumer", spec(), tag=2, **kw)
    early = [ch.recv() for _ in range(5)]
    out["early_ok"] = [r.sample_id for r in early] == list(range(5)) and all(
        same_record(r, make_record(r.sample_id, 4), torch.float32) for r in early
    )
    ch.close()
    phase("stop")
    ch = P2PChannel(0, "consumer", spec(torch.bfloat16), tag=3, **kw)
    _recv_bf16_then_error(ch, out)
    phase("error")
    with FanInChannel.connect([0], spec(), tag=4, **kw) as fan:
        got = list(iter(fan.recv, None))
    out["fan_ok"] = [r.sample_id for r in got] == [0, 1, 2] and all(
        same_record(r, make_record(r.sample_id, LENGTHS[r.sample_id]), torch.float32) for r in got
    )
    phase("fan")
    return out


def _hdr(op: str) -> tuple:
    """A header (or HELLO) call: control group, int64 (16,)."""
    return ("control", op, "int64", 16, None)


def _probe(op: str) -> tuple:
    return ("payload", op, "int64", 1, None)



def _payload_calls(op: str, t: int, dt: str = "float32") -> list[tuple]:
    """The payload-group calls of one record of t tokens, in order (none for t=0)."""
    shapes = [("int64", t), ("uint8", t), (dt, t * M * D), (dt, t * D)]
    return [("payload", op, d, n, None) for d, n in shapes] if t else []


def _without_credits(calls: list[tuple]) -> list[tuple]:
    """Drop the credit traffic (one int64 on the control group), which interleaves by timing."""
    return [c for c in calls if not (c[0] == "control" and c[2:4] == ("int64", 1))]


def test_p2p_control_on_one_group_payloads_on_another() -> None:
    res = run_ranks(_planes_ranks, 2)
    prod, cons = res[0], res[1]
    for end in (prod, cons):
        # No call on any other group; every payload call waited for once its phase ends.
        calls = [c for k, v in end.items() if k.endswith("_calls") for c in v]
        assert {c[0] for c in calls} == {"control", "payload"}
        assert all(end[k] == 0 for k in end if k.endswith("_pending"))
    # Ends that disagree both refuse after the HELLO, before anything on the payload group.
    assert {c[0] for c in prod["mismatch_calls"] + cons["mismatch_calls"]} == {"control"}

    # Records round-trip exactly, in order, on a slow consumer, each receive complete on return.
    assert cons["ids"] == list(range(len(LENGTHS))) and cons["bad"] == []
    assert cons["pending_after_recv"] == [0] * len(LENGTHS)
    assert prod["stats"]["records"] == cons["stats"]["records"] == len(LENGTHS)
    assert prod["stats"]["bytes"] == cons["stats"]["bytes"] and prod["stats"]["max_in_flight"] == 3
    # Producer: HELLO on control, the probe on the payload group, then each header on control
    # followed at once by that record's payload sends; END's header last.
    want = [_hdr("recv"), _hdr("isend"), _probe("isend")]
    want += [c for t in LENGTHS for c in [_hdr("isend"), *_payload_calls("isend", t)]] + [_hdr("isend")]
    assert _without_credits(prod["records_calls"]) == want
    # Consumer: each payload receive is posted only after its header has arrived (a blocking recv).
    want = [_hdr("isend"), _hdr("recv"), _probe("irecv")]
    want += [c for t in LENGTHS for c in [_hdr("recv"), *_payload_calls("irecv", t)]] + [_hdr("recv")]
    assert _without_credits(cons["records_calls"]) == want
    # Credits: one per message on the control group, and the producer posts its receives there.
    credits = [c for c in cons["records_calls"] if c[2:4] == ("int64", 1) and c[0] == "control"]
    assert credits == [("control", "isend", "int64", 1, 1)] * (len(LENGTHS) + 1)
    assert all(c[0] == "control" for c in prod["records_calls"] if c[1] == "irecv")

    # Early stop: the stop goes on the control group; both ends shut down cleanly.
    assert cons["early_ok"] and 5 <= prod["stopped_after"] <= 5 + 3 + 1
    assert ("control", "isend", "int64", 1, -1) in cons["stop_calls"]

    # ERROR's text is control traffic; the bf16 record's payload alone is on the payload group.
    assert cons["bf16_ok"] and "producer rank 0 failed: target crashed" in cons["error"]
    text = ("control", "isend", "uint8", len("target crashed"), None)
    assert text in prod["error_calls"]
    payload = [c for c in prod["error_calls"] if c[0] == "payload"]
    assert payload == [_probe("isend"), *_payload_calls("isend", 6, "bfloat16")]

    # FanIn/FanOut pass both groups on.
    assert cons["fan_ok"] and any(c[0] == "payload" for c in prod["fan_calls"])
