"""STS calibration of the confidence head: ECE by hand, recovery of a known miscalibration,
confidence recording that leaves decoding untouched, and calibration carried through export."""

import json

import pytest
import torch
from tiny import tiny_draft, tiny_target

import splitserve  # noqa: F401  (registers the Auto classes)
from splitserve.evaluation.calibration import calibrate_run
from splitserve.export import export_draft
from splitserve.speculative.calibrate import (
    ece,
    fit_sts,
    prefix_acceptance,
    survival,
    survival_ece,
)
from splitserve.speculative.calibration_file import load_calibration, temperatures_for
from splitserve.speculative.decode import SpecDecoder


def test_ece_hand_computed():
    conf = torch.tensor([0.1, 0.2, 0.8, 0.9])
    outcome = torch.tensor([0.0, 1.0, 1.0, 1.0])
    # 2 bins: [0, .5) holds .1, .2 (mean .15, outcome mean .5); [.5, 1] holds .8, .9 (.85 vs 1).
    # ECE = 2/4 * |.15 - .5| + 2/4 * |.85 - 1| = .175 + .075
    assert ece(conf, outcome, n_bins=2) == pytest.approx(0.25)
    # 10 bins: every point alone, so ECE is the mean absolute gap (.1 + .8 + .2 + .1) / 4.
    assert ece(conf, outcome, n_bins=10) == pytest.approx(0.3)
    # c = 1 lands in the last bin; exact: 2.0 - 2.0 in float64
    assert ece(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0])) == 0.0


def test_prefix_survival_by_hand():
    accepts = torch.tensor([0, 2, 3])
    assert prefix_acceptance(accepts, 3).tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 1]]
    logits = torch.zeros(1, 3)  # c = .5 everywhere
    assert survival(logits)[0].tolist() == pytest.approx([0.5, 0.25, 0.125])
    want = torch.sigmoid(torch.tensor(1.0)).item()
    assert survival(torch.tensor([[2.0]]), torch.tensor([2.0])).item() == pytest.approx(want)


def _synthetic_rounds(n: int, true_temps: torch.Tensor, seed: int = 0):
    """Rounds whose true conditional acceptance is sigmoid(z); the head reports z * T (T > 1
    overconfident, T < 1 underconfident), so STS should find T back at every position."""
    g = torch.Generator().manual_seed(seed)
    z = 1.0 + 1.5 * torch.randn(n, len(true_temps), generator=g)  # (N, γ)
    accepted = torch.bernoulli(torch.sigmoid(z), generator=g)
    n_acc = accepted.cumprod(-1).sum(-1).long()  # (N,) a prefix event: stop at the first rejection
    return z * true_temps, n_acc


def test_fit_sts_recovers_a_known_temperature():
    true_temps = torch.tensor([2.0, 0.5, 3.0, 1.5])
    logits, accepts = _synthetic_rounds(20000, true_temps)
    temps = fit_sts(logits, accepts)
    before, before_pos = survival_ece(logits, accepts)
    after, after_pos = survival_ece(logits, accepts, temps)
    assert before > 0.04 and after < 0.01 and after < before / 5
    assert all(a < b for a, b in zip(after_pos, before_pos))
    assert torch.allclose(temps.float(), true_temps, rtol=0.12), temps
    # On fresh rounds from the same process, the fitted temperatures still calibrate.
    fresh_logits, fresh_accepts = _synthetic_rounds(20000, true_temps, seed=1)
    assert survival_ece(fresh_logits, fresh_accepts, temps)[0] < 0.01


def test_fit_sts_leaves_a_calibrated_head_near_one():
    logits, accepts = _synthetic_rounds(20000, torch.ones(3))
    assert torch.allclose(fit_sts(logits, accepts).float(), torch.ones(3), rtol=0.12)


def test_recording_confidences_leaves_decoding_unchanged():
    target = tiny_target(seed=4)
    draft = tiny_draft(target, block_size=4, markov_rank=8)
    torch.nn.init.normal_(draft.confidence.proj.weight, std=0.5)
    dec = SpecDecoder(target, draft)
    for temperature in (0.0, 1.0):
        plain = dec.generate([3, 9, 27], 24, temperature, generator=torch.Generator().manual_seed(0))
        rec = dec.generate([3, 9, 27], 24, temperature, generator=torch.Generator().manual_seed(0),
                           record_confidence=True)
        # bit-equal: recording only reads the confidences; both runs do the same ops
        assert (rec.tokens, rec.accepts) == (plain.tokens, plain.accepts) and plain.confidences == []
        assert len(rec.confidences) == len(rec.accepts) and all(len(c) == 4 for c in rec.confidences)
        assert all(0.0 < x < 1.0 for c in rec.confidences for x in c)


def test_calibration_survives_export(tmp_path):
    from transformers import AutoConfig, AutoModel

    target = tiny_target(seed=5)
    draft = tiny_draft(target, block_size=4, markov_rank=8).eval()
    torch.nn.init.normal_(draft.confidence.proj.weight, std=0.5)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 90, (6,), generator=g).tolist() for _ in range(6)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fits = calibrate_run(run_dir, target, draft, prompts, [0.0, 1.0], max_new_tokens=24, n_bins=5)
    cal = load_calibration(run_dir)
    assert [f["sampling_temperature"] for f in cal["fits"]] == [0.0, 1.0]
    assert cal["fits"] == json.loads(json.dumps(fits))  # bit-equal: JSON writes floats by repr
    for f in fits:
        assert len(f["temperatures"]) == 4 and f["rounds"] > 0
        assert f["ece_after"] <= f["ece_before"] + 1e-9  # T = 1 is on the grid

    out = export_draft(draft, tmp_path / "export", target.info, cal)
    assert load_calibration(out) == cal
    assert AutoConfig.from_pretrained(out).confidence_temperatures == fits[0]["temperatures"]
    assert AutoModel.from_pretrained(out).config.confidence_temperatures == fits[0]["temperatures"]
    assert temperatures_for(load_calibration(out), 1.0) == fits[1]["temperatures"]
    # An export without calibration has none, and says so.
    bare = export_draft(draft, tmp_path / "bare", target.info)
    assert AutoConfig.from_pretrained(bare).confidence_temperatures is None and load_calibration(bare) is None
