"""check_capture_varies: one tiny forward at the start of training refuses captured hidden states
that are empty, zero, not finite, or the same for two different inputs, naming the layer."""

from pathlib import Path

import pytest
import torch
from tiny import tiny_draft, tiny_target

from splitserve.errors import UserError
from splitserve.records import Capture
from splitserve.target.capture_check import check_capture_varies, probe_ids

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLE_CHAT = str(Path(__file__).resolve().parents[1] / "data" / "sample_chat.jsonl")


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3)  # 6 layers, captures 1, 2, 4


def _replace_output(target, layer: int, make):
    """A hook that runs before the target's own capture hook and replaces layer `layer`'s output."""

    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (make(output[0]), *output[1:])
        return make(output)

    return target.model.get_decoder().layers[layer].register_forward_hook(hook, prepend=True)


def _refusal(target) -> str:
    with pytest.raises(UserError) as err:
        check_capture_varies(target)
    msg = str(err.value)
    assert "\n" not in msg and "tiny-llama" in msg
    return msg


def test_probe_rows_differ_everywhere_and_stay_in_the_vocabulary():
    for vocab in (2, 96, 49152):
        ids = probe_ids(vocab)
        assert ids.shape == (2, 16) and int(ids.min()) >= 0 and int(ids.max()) < vocab
        assert (ids[0] != ids[1]).all()
    assert torch.equal(probe_ids(96), probe_ids(96))


def test_a_working_target_passes(target):
    check_capture_varies(target)
    assert not target._captured  # nothing left behind for the next capture


@pytest.mark.parametrize("make, fault", [
    (torch.zeros_like, "layer 4: all zero"),
    (lambda h: torch.full_like(h, 0.5), "layer 4: the same for both inputs"),
    (lambda h: h * float("nan"), "layer 4: not finite"),
])
def test_a_broken_captured_layer_is_named(target, make, fault):
    handle = _replace_output(target, 4, make)
    try:
        msg = _refusal(target)
    finally:
        handle.remove()
    assert fault in msg and "layer 1" not in msg and "layer 2" not in msg
    check_capture_varies(target)  # the hook gone, the target passes again


def test_an_early_zeroed_layer_names_it_and_the_layers_it_feeds(target):
    handle = _replace_output(target, 2, torch.zeros_like)
    try:
        msg = _refusal(target)
    finally:
        handle.remove()
    assert "layer 2: all zero" in msg and "layer 1:" not in msg


class _Stub:
    """A capture-only target whose capture returns what a test sets."""

    def __init__(self, real, aux, final=None):
        self.info, self.tokenizer, self.device = real.info, None, torch.device("cpu")
        self._cap = Capture(aux=aux, final=final)

    def capture(self, input_ids, attention_mask=None):
        return self._cap


def test_empty_or_misshapen_hidden_states_are_refused(target):
    msg = _refusal(_Stub(target, torch.zeros(2, 16, 0)))
    assert "(2, 16, 0)" in msg and "(2, 16, 96)" in msg and "[1, 2, 4]" in msg
    good = target.capture(probe_ids(96))
    msg = _refusal(_Stub(target, good.aux, torch.zeros_like(good.final)))
    assert "final hidden state: all zero" in msg and "layer 1:" not in msg and "layer 4:" not in msg


def test_training_refuses_a_broken_capture_before_its_first_step(tiny_smol_dir, tmp_path):
    from splitserve.config import DataConfig, DraftConfig, EvalConfig, RunConfig, TargetConfig, TrainConfig
    from splitserve.models.run_files import latest_checkpoint
    from splitserve.target.hf import load_hf_target
    from splitserve.train import loop

    tcfg = TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), layer_ids=[0, 1, 2], device="cpu")
    smol = load_hf_target(tcfg)
    cfg = RunConfig(target=tcfg, draft=DraftConfig(num_layers=1, block_size=4, markov_rank=4, intermediate_size=32),
                    data=DataConfig(train_path=SAMPLE_CHAT, max_length=64),
                    train=TrainConfig(max_steps=2, batch_size=2, anchors_per_seq=4, device="cpu"),
                    eval=EvalConfig(enabled=False), run_dir=str(tmp_path / "run"))
    handle = _replace_output(smol, 2, torch.zeros_like)
    try:
        with pytest.raises(UserError, match="layer 2: all zero"):
            loop.train(cfg, smol)
    finally:
        handle.remove()
    assert latest_checkpoint(tmp_path / "run") is None

