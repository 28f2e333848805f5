"""τ per prompt-length bucket (evaluation/length_buckets.py, `splitserve eval --length-buckets`):
prompts cut from whole conversations where a reply starts, each in its bucket, decoded by
speculative decoding against the target."""

import json
from pathlib import Path

import pytest
import torch
from tiny import export_tiny_draft, tiny_draft, tiny_target

import splitserve.cli as cli
from splitserve.data.chat import TokenizedSample
from splitserve.evaluation import length_buckets as lb

pytestmark = pytest.mark.usefixtures("one_thread")
SAMPLE_CHAT = str(Path(__file__).resolve().parents[1] / "data" / "sample_chat.jsonl")


def _conversations(n: int, seed: int = 0) -> list[TokenizedSample]:
    """n conversations of 2-4 turns: an untrained header of 3-9 tokens, then a reply of 5-40."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids, mask = [], []
        for _ in range(int(torch.randint(2, 5, (1,), generator=g))):
            head, reply = (int(torch.randint(a, b, (1,), generator=g)) for a, b in ((3, 10), (5, 41)))
            ids += torch.randint(90, (head + reply,), generator=g).tolist()
            mask += [0] * head + [1] * reply
        out.append(TokenizedSample(ids, mask, f"c{i}", False))
    return out


def test_every_prompt_starts_a_conversation_ends_where_a_reply_starts_and_lies_in_its_bucket():
    stream = lb.Stream.of(_conversations(60))
    buckets = lb.cut_prompts(stream, [64, 256, 1024, 4096], per_bucket=5, max_prompt=2000)
    assert list(buckets) == ["≤64", "64–256", "256–1K", "1K–4K"]
    bounds = {"≤64": (0, 64), "64–256": (64, 256), "256–1K": (256, 1024), "1K–4K": (1024, 2000)}
    starts, replies = set(stream.starts), set(stream.replies)
    for label, prompts in buckets.items():
        lo, hi = bounds[label]
        assert 3 <= len(prompts) <= 5, (label, len(prompts))
        assert len({tuple(p) for p in prompts}) == len(prompts)
        for p in prompts:
            assert lo < len(p) <= hi, (label, len(p))
            start = next(s for s in sorted(starts) if stream.ids[s: s + len(p)] == p)
            assert start in starts and start + len(p) in replies
    # lengths spread over the bucket, not all at one end
    spread = [len(p) for p in buckets["256–1K"]]
    assert max(spread) - min(spread) > 200
    # a bucket above the target's context is empty, not cut short
    assert lb.cut_prompts(stream, [64, 4096], 3, max_prompt=64)["64–4K"] == []
    with pytest.raises(ValueError, match="increasing positive edges"):
        lb.cut_prompts(stream, [256, 64], 3, 100)


def test_each_bucket_is_decoded_against_the_target_and_reads_back():
    target = tiny_target(seed=2)
    draft = tiny_draft(target, block_size=4, markov_rank=8).eval()
    stream = lb.Stream.of(_conversations(20, seed=1))
    buckets = lb.cut_prompts(stream, [32, 128, 102400], per_bucket=2, max_prompt=150)
    results = lb.tau_by_length(target, draft, buckets, max_new_tokens=6, temperature=0.0, seed=0)
    assert [r.label for r in results] == ["≤32", "32–128", "128–100K"]
    for r in results:
        assert r.prompts == len(buckets[r.label]) == r.report.num_prompts
        assert r.report.exact_matches == r.prompts  # greedy: the target's own output
        assert r.report.tau >= 1.0 and r.report.tokens == 6 * r.prompts
    table = lb.format_table({"tiny": results})
    assert "| tiny | 32–128 | 2 |" in table


def test_cli_writes_the_table_json_and_plot(tiny_smol_dir, tmp_path, capsys):
    hf = export_tiny_draft(tiny_smol_dir, tmp_path / "hf")
    cli.main(["eval", "--draft", str(hf), "--target", str(tiny_smol_dir), "--prompts", SAMPLE_CHAT,
              "--length-buckets", "40", "120", "--per-bucket", "2", "--max-new-tokens", "6", "--device", "cpu",
              "--out", str(tmp_path / "lengths")])
    out = capsys.readouterr().out
    assert "| draft | context bucket |" in out and "lengths.json" in out
    raw = json.loads((tmp_path / "lengths" / "lengths.json").read_text())
    rows = raw["hf"]
    assert [r["bucket"] for r in rows] == ["≤40", "40–120"] and sum(r["prompts"] for r in rows) > 0
    assert (tmp_path / "lengths" / "lengths.png").stat().st_size > 1000
    back = lb.read(tmp_path / "lengths" / "lengths.json")
    assert [b.prompts for b in back["hf"]] == [r["prompts"] for r in rows]
