"""Every architecture of the matrix (tests/arch_matrix.py), end to end on tiny random targets
saved as HF directories: train a few steps, held-out greedy speculative output equal to the
target's own, HF export round trip, the serving engine equal to transformers' greedy
`generate` on a chat prompt, verification logits equal to the architecture's own (soft-
capping and scaling included), and grouped training captures equal to per-sample ones.
Hybrid and purely recurrent targets (gated DeltaNet, KDA, Mamba-2), MLA and attention sinks are
served; a layer kind with no rewind here (LFM2's short convolutions) is refused at start from
its config alone.
`python bench/target_matrix.py` runs the same checks and writes docs/targets.md."""

import pytest
from arch_matrix import RECURRENT, REFUSED, SERVED, WINDOW, chat_ids, check_refused, check_served

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", SERVED)
def test_served_architecture(arch, tmp_path):
    row = check_served(arch, tmp_path)
    assert row.train, row
    assert row.exact, f"{arch}: held-out speculative greedy output differs from the target's own"
    assert row.export, row
    assert row.serve_equal, f"{arch}: the serving engine differs from transformers' greedy generate"
    assert row.t1_logits, row
    assert row.grouped_capture, f"{arch}: a sample captured in a length-bucket group differs from its own capture"
    if arch in ("mistral-window", "gemma2", "gemma3-text", "gemma3-multimodal", "gpt-oss"):
        assert f"sw{WINDOW}" in row.windows.split(), row  # the window is seen, hence honoured above
    if arch in RECURRENT:
        assert any(w.startswith("rec") for w in row.windows.split()), row  # served through the recurrent rewind


@pytest.mark.parametrize("arch", REFUSED)
def test_unknown_layer_kind_refused_at_start(arch, tmp_path):
    row = check_refused(arch, tmp_path)  # only config.json is saved: no weight is read
    assert row.refused is not None, f"{arch} was not refused"
    assert "\n" not in row.refused
    assert "Lfm2ForCausalLM" in row.refused and "layers of kind conv" in row.refused


def test_matrix_prompt_outgrows_the_window(smollm2_tokenizer):
    """The chat prompt alone is longer than the sliding window, so the window is exercised."""
    assert len(chat_ids(smollm2_tokenizer)) > 2 * WINDOW
