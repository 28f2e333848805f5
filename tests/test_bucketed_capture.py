"""Bucketed training captures: padding a sample to its power-of-two bucket changes none of its
real positions' hidden states (causal attention), so records match the unpadded capture."""

import pytest
import torch
from tiny import tiny_target

from splitserve.data.chat import TokenizedSample
from splitserve.stream.sources import TargetSource
from splitserve.target.bucketed import BucketedCapture


def _samples(lengths, vocab):
    g = torch.Generator().manual_seed(0)
    return [TokenizedSample(torch.randint(vocab, (n,), generator=g).tolist(), [1] * n, f"s{i}", False)
            for i, n in enumerate(lengths)]


def test_bucket_sizes():
    cap = BucketedCapture(tiny_target(), max_len=300, min_bucket=64, use_graphs=False)
    assert [cap.bucket(n) for n in (1, 64, 65, 128, 129, 300)] == [64, 64, 128, 128, 256, 512]
    assert cap.max_bucket == 512


def test_bucketed_records_equal_unpadded_records():
    target = tiny_target()
    lengths = [1, 5, 63, 64, 65, 130, 200]
    samples = _samples(lengths, target.info.vocab_size)
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
    graphed = BucketedCapture(target, max_len=256)
    eager = BucketedCapture(target, max_len=256, use_graphs=False)
    for n in (7, 50, 64, 100, 7):  # the second 7 replays an existing graph
        ids = torch.randint(target.info.vocab_size, (n,))
        a, b = graphed(ids), eager(ids)
        assert graphed.graphs.enabled
        torch.testing.assert_close(a.aux, b.aux)
        torch.testing.assert_close(a.final, b.final)


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
