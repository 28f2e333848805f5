"""Export round trip through transformers, and drafts refused by the wrong target."""

import json

import pytest
import torch
from floats import assert_float32_close
from tiny import tiny_draft, tiny_target

import splitserve  # noqa: F401  (registers the Auto classes)
import splitserve.cli as cli
from splitserve.export import export_draft
from splitserve.loading import load_draft
from splitserve.models.build import DraftMismatchError
from splitserve.models.run_files import CheckpointError

CTX, GAMMA = 12, 8  # the round trip's block: 8 tokens after a 12-token context


def export_tiny(out_dir, head: str):
    target = tiny_target(seed=1)
    draft = tiny_draft(target, block_size=GAMMA, markov_rank=8, markov_head_type=head)
    torch.nn.init.normal_(draft.markov.w2.weight, std=0.5)
    return target, draft, export_draft(draft, out_dir, target.info)


@pytest.fixture(params=["vanilla", "rnn"])
def exported(tmp_path, request):
    return export_tiny(tmp_path / "export", request.param)


def round_trip_logits(target, draft, model, anchor_pos: int | None = None):
    """-> (the HF-wrapped model's logits, the draft's own) for one teacher-forced block at
    positions CTX.. after a CTX-token context; `anchor_pos` moves the wrapper's block."""
    ids = torch.randint(0, 90, (1, CTX + GAMMA), generator=torch.Generator().manual_seed(0))
    aux = target.capture(ids).aux
    block = ids[:, CTX:]
    with torch.no_grad():
        got = model(aux[:, :CTX], block, anchor_pos)
        ctx = draft.context_kv(aux[:, :CTX], torch.arange(CTX)[None])
        h = draft.backbone(draft.block_inputs(block[:, 0]), torch.arange(CTX, CTX + GAMMA)[None], ctx, None)
        want = draft.logits(h, block)
    return got, want


def test_config_fields(exported):
    _, _, out = exported
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DSparkDraftModel"] and cfg["model_type"] == "dspark"
    for key in ("block_size", "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type",
                "enable_confidence_head", "target_name", "target_vocab_size", "target_hidden_size"):
        assert key in cfg, key
    assert cfg["block_size"] == 8 and cfg["target_layer_ids"] == [1, 2, 4] and cfg["target_vocab_size"] == 96


def test_round_trip_identical_logits(exported):
    from transformers import AutoConfig, AutoModel

    target, draft, out = exported
    assert AutoConfig.from_pretrained(out).model_type == "dspark"
    model = AutoModel.from_pretrained(out).eval()
    # Identical weights, but another module instance: its GEMMs may take other kernel paths
    # (one AMD EPYC differed by 4.8e-7), so close, not bit-equal (test_float_tolerance.py).
    assert_float32_close(*round_trip_logits(target, draft, model))
    reloaded = load_draft(out, target)
    for k, v in draft.state_dict().items():
        # bit-equal: both sides are the same bytes, written to safetensors and read back
        assert torch.equal(v, reloaded.state_dict()[k]), k


def test_corrupt_export_is_a_clear_error(exported):
    target, _, out = exported
    f = out / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_draft(out, target)


@pytest.mark.parametrize(
    "other, match",
    [
        (dict(vocab=128), "vocab size 96 vs target 128"),
        (dict(hidden=64), "hidden size 32 vs target 64"),
        (dict(layers=4, layer_ids=(1, 2)), "layer ids"),
    ],
)
def test_draft_for_another_target_refused_before_compute(exported, tmp_path, monkeypatch, other, match):
    _, _, out = exported
    other_target = tiny_target(seed=2, **other)
    other_dir = tmp_path / "other"
    other_target.model.save_pretrained(other_dir)

    def no_weights(*a, **k):
        raise AssertionError("target weights were loaded before the compatibility check")

    monkeypatch.setattr("splitserve.target.hf.load_hf_target", no_weights)
    with pytest.raises(DraftMismatchError, match=match):
        cli.eval_main(["--draft", str(out), "--target", str(other_dir)])
    # The same check guards direct loading too.
    with pytest.raises(DraftMismatchError):
        load_draft(out, other_target)
