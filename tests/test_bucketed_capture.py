"""Bucketed training captures: padding a sample to its power-of-two bucket changes none of its
real positions' hidden states (causal attention), so records match the unpadded capture."""

import pytest
import torch
from tiny import random_samples, tiny_target

from splitserve.stream.sources import TargetSource
from splitserve.target.bucketed import BucketedCapture
from splitserve.target.graphs import StepGraphs
from splitserve.target.native.target import native_target


def test_bucket_sizes():
    cap = BucketedCapture(tiny_target(), max_len=300, min_bucket=64, use_graphs=False)
    assert [cap.bucket(n) for n in (1, 64, 65, 128, 129, 300)] == [64, 64, 128, 128, 256, 512]
    assert cap.max_bucket == 512


def test_bucketed_records_equal_unpadded_records():
    target = tiny_target()
    lengths = [1, 5, 63, 64, 65, 130, 200]
    samples = random_samples(lengths, target.info.vocab_size)
    plain = TargetSource(target, samples).get(list(range(len(samples))))
    padded = TargetSource(target, samples, bucketed=True).get(list(range(len(samples))))
    for a, b, n in zip(plain, padded, lengths):
        assert b.aux.shape == a.aux.shape == (n, a.aux.shape[-1]) and b.final.shape == a.final.shape
        torch.testing.assert_close(b.aux, a.aux, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.final, a.final, rtol=1e-5, atol=1e-5)
        assert torch.equal(b.input_ids, a.input_ids)


def test_sample_longer_than_the_largest_bucket_runs_at_its_own_length():
    target = tiny_target()
    cap = BucketedCapture(target, max_len=64, use_graphs=False)
    ids = torch.randint(target.info.vocab_size, (100,))
    out = cap(ids)
    ref = target.capture(ids[None])
    assert out.aux.shape[1] == 100
    torch.testing.assert_close(out.aux, ref.aux)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_equals_eager_capture_on_gpu():
    target = tiny_target()
    target.model.cuda()
    for group_tokens in (0, 256):
        graphed = BucketedCapture(target, max_len=256, group_tokens=group_tokens)
        eager = BucketedCapture(target, max_len=256, use_graphs=False, group_tokens=group_tokens)
        for n in (7, 50, 64, 100, 7):  # the second 7 replays an existing graph
            ids = torch.randint(target.info.vocab_size, (n,))
            a, b = graphed(ids), eager(ids)
            assert graphed.graphs.enabled
            torch.testing.assert_close(a.aux, b.aux)
            torch.testing.assert_close(a.final, b.final)
        many = [torch.randint(target.info.vocab_size, (n,)) for n in (7, 50, 64, 100, 30)]
        for a, b in zip(graphed.capture_many(many), eager.capture_many(many)):
            torch.testing.assert_close(a.aux, b.aux)


class _Graph:
    """Stands in for a captured CUDA graph: counts its replays."""

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_graphs_captured_before_the_weights_moved_are_dropped():
    """A graph holds the addresses of the weights it read. Once the target's weights move to new
    storage (weights_version bumped), a graph captured before is forgotten and the step runs
    instead, so no replay reads freed memory; the next prepare captures it again."""
    target = tiny_target()
    graphs = StepGraphs(False, torch.device("cpu"), source=target)
    graphs._graphs["step"] = graph = _Graph()  # as if captured at the current version
    calls = []
    graphs.run("step", lambda: calls.append("eager"))
    assert graph.replays == 1 and calls == []
    native_target(target, decoder="native")  # packs q|k|v and gate|up into new storage
    assert target.weights_version == 1
    assert "step" not in graphs
    graphs._graphs["other"] = later = _Graph()  # captured after the move: kept
    graphs.run("step", lambda: calls.append("eager"))
    graphs.run("other", lambda: calls.append("eager"))
    assert graph.replays == 1 and calls == ["eager"] and later.replays == 1
    native_target(target, decoder="native")  # packed once per target: nothing moves again
    assert target.weights_version == 1 and "other" in graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bucketed_captures_after_the_native_decoder_packs_the_weights():
    """Training's bucketed graphs, captured before an engine's native decoder re-points the
    target's modules at packed weights, would replay over the freed storage (an illegal memory
    access, or silently wrong hidden states once that memory is reused): they are captured again."""
    target = tiny_target()
    target.model.cuda()
    graphed = BucketedCapture(target, max_len=128)
    ids = torch.randint(target.info.vocab_size, (50,))
    before = graphed(ids)
    native_target(target, decoder="native")
    torch.cuda.empty_cache()  # the old q|k|v and gate|up storage goes back to the driver
    junk = torch.full((1 << 20,), float("nan"), device="cuda")  # whatever reuses that memory
    after = graphed(ids)
    assert graphed.graphs.enabled and 64 in graphed.graphs
    torch.testing.assert_close(after.aux, before.aux)
    torch.testing.assert_close(after.final, before.final)
    del junk


def test_capture_graphs_default_is_on_for_cuda_only():
    from splitserve.config import TargetConfig
    from splitserve.target.bucketed import use_capture_graphs

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert TargetConfig().capture_graphs is None
    assert use_capture_graphs(TargetConfig(), cuda) and not use_capture_graphs(TargetConfig(), cpu)
    assert not use_capture_graphs(TargetConfig(backend="sglang"), cuda)  # SGLang runs its own graphs
    assert use_capture_graphs(TargetConfig(capture_graphs=True), cpu)  # explicit wins (eager buckets on CPU)
    assert not use_capture_graphs(TargetConfig(capture_graphs=False), cuda)
    with pytest.raises(ValueError, match="transformers backend"):
        use_capture_graphs(TargetConfig(backend="sglang", capture_graphs=True), cuda)


def test_grouped_records_equal_unpadded_records():
    """Samples of one bucket share a forward (group_tokens // L rows); each record still equals
    the sample's own unpadded capture, whatever the other rows hold."""
    target = tiny_target()
    lengths = [5, 40, 63, 64, 65, 70, 100, 130, 200, 3]
    samples = random_samples(lengths, target.info.vocab_size)
    order = list(range(len(samples)))
    plain = TargetSource(target, samples).get(order)
    grouped = TargetSource(target, samples, bucketed=True, group_tokens=256)
    assert [grouped.bucketed.rows(n) for n in (64, 128, 256, 512)] == [4, 2, 1, 1]
    for got in (grouped.get(order), grouped.get(order[::-1])[::-1], [grouped.get([i])[0] for i in order]):
        for a, b, n in zip(plain, got, lengths):
            assert b.sample_id == a.sample_id and b.aux.shape == a.aux.shape == (n, a.aux.shape[-1])
            torch.testing.assert_close(b.aux, a.aux, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(b.final, a.final, rtol=1e-5, atol=1e-5)


def test_group_rows_fill_each_bucket_forward():
    """Forwards per bucket: ceil(samples / rows); a longer-than-any-bucket sample runs alone."""
    target = tiny_target()
    calls = []
    capture = target.capture
    target.capture = lambda ids, *a, **k: calls.append(tuple(ids.shape)) or capture(ids, *a, **k)
    cap = BucketedCapture(target, max_len=128, use_graphs=False, group_tokens=256)
    ids = [torch.randint(target.info.vocab_size, (n,)) for n in (10, 20, 30, 40, 50, 100, 300)]
    out = cap.capture_many(ids)
    assert [o.aux.shape[1] for o in out] == [10, 20, 30, 40, 50, 100, 300]
    assert sorted(calls) == sorted([(4, 64), (4, 64), (2, 128), (1, 300)])
    with pytest.raises(ValueError, match="group_tokens"):
        BucketedCapture(target, max_len=128, group_tokens=-1)
