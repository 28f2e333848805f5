"""Golden loss curve: 10 training steps of a tiny random DSpark draft on CPU, step for step
against tests/golden/tiny_dspark_loss.json.

The run goes through the real trainer (train/loop.py: data order, anchor sampling, packing, the
paper loss, AdamW with warmup and clipping) on chat rows tokenized with SmolLM2's template and
masks, against a tiny random Llama whose weights are drawn here from one seeded generator (not
by transformers' initialisers, so a transformers release that changes its init does not move
the curve). A change in what training computes moves these numbers; a refactor must not.

Regenerate the file after a deliberate change to training (say why in the commit):

    PYTHONPATH=. python tests/test_golden_loss.py

Tolerance. The stored values are float32 losses over ~250 block positions after up to 10 AdamW
steps. What legitimately differs between CPUs (Intel vs AMD, AVX2 vs AVX-512 kernels, MKL or
oneDNN paths, thread counts) is the order of float32 additions inside matmuls and reductions:
relative differences of ~1e-7 per op. Measured here: 2 threads instead of 1 moved no value by
more than 1.0e-7 relative, oneDNN off by 0. rtol 1e-4 leaves three orders of magnitude for that
(and the test runs on 1 thread anyway), while every real change tried moved values by 6e-4 or
more: AdamW's beta2 0.95 -> 0.9 (max 5.9e-4, 24 values outside), the position decay g 4 -> 4.2
(6.4e-3), the CE/TV mix 0.1/0.9 -> 0.11/0.89 (4.6e-2), the loss mask shifted by one token (0.12).
atol 1e-6 only matters for values near zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

GOLDEN = Path(__file__).parent / "golden" / "tiny_dspark_loss.json"
KEYS = ("loss", "ce", "tv", "conf", "alpha")
RTOL, ATOL = 1e-4, 1e-6
STEPS = 10

ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "The capital of France is Paris, on the Seine."}]},
    {"prompt": "Give me three synonyms for happy.", "response": "Cheerful, content and joyful."},
    {"messages": [{"role": "system", "content": "You answer in one short sentence."},
                  {"role": "user", "content": "Why is the sky blue?"},
                  {"role": "assistant", "content": "Air scatters blue sunlight more than red light."},
                  {"role": "user", "content": "And at sunset?"},
                  {"role": "assistant", "content": "The light crosses more air, so mostly red is left."}]},
    {"messages": [{"role": "user", "content": "Name a prime number above ten."},
                  {"role": "assistant", "content": "Eleven is prime, and so are 13 and 17."}]},
    {"prompt": "Translate 'good morning' to French.", "response": "Bonjour."},
    {"messages": [{"role": "user", "content": "How many legs does a spider have?"},
                  {"role": "assistant", "content": "A spider has eight legs."},
                  {"role": "user", "content": "And an ant?"},
                  {"role": "assistant", "content": "An ant has six legs, like every insect."}]},
]


def _target():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from splitserve.assets import smollm2_dir
    from splitserve.target.hf import wrap_hf_model

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:  # embeddings x8 so the target's distributions are not all near-uniform
                p.copy_(torch.randn(p.shape, generator=g) * (0.16 if "embed" in name else 0.05))
    return wrap_hf_model(model, _target_cfg(), tok)


def _target_cfg():
    from splitserve.config import TargetConfig

    return TargetConfig(name="golden-tiny", path="golden-tiny", layer_ids=[0, 1, 2], device="cpu")


def run_curve(tmp: Path, **loss_kw) -> list[dict[str, float]]:
    """The 10-step run; its per-step metrics (loss_kw: LossConfig overrides, for perturbing)."""
    from splitserve.config import DataConfig, DraftConfig, EvalConfig, LossConfig, RunConfig, TrainConfig
    from splitserve.train.loop import train

    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = RunConfig(
        target=_target_cfg(),
        draft=DraftConfig(num_layers=1, block_size=4, markov_rank=4, intermediate_size=32),
        data=DataConfig(train_path=str(data), max_length=64),
        loss=LossConfig(**loss_kw),
        train=TrainConfig(max_steps=STEPS, batch_size=2, anchors_per_seq=4, lr=3e-3, warmup_steps=2,
                          log_every=1, save_every=STEPS, device="cpu", seed=7),
        eval=EvalConfig(enabled=False),
        run_dir=str(tmp / "run"),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order on any machine (and no thread hand-offs)
    try:
        train(cfg, _target())
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [{k: float(r[k]) for k in KEYS} for r in rows]


def compare(got: list[dict], want: list[dict]) -> list[str]:
    """Every value outside the tolerance, as 'step N key: got vs want'."""
    bad = []
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for k in KEYS:
            if abs(g[k] - w[k]) > ATOL + RTOL * abs(w[k]):
                bad.append(f"step {step} {k}: {g[k]!r} vs golden {w[k]!r}")
    return bad


def test_loss_curve_matches_golden(tmp_path):
    want = json.loads(GOLDEN.read_text())["steps"]
    got = run_curve(tmp_path)
    bad = compare(got, want)
    assert not bad, ("the training curve moved (regenerate with `PYTHONPATH=. python tests/test_golden_loss.py` "
                     "only if the change is deliberate):\n" + "\n".join(bad))


def test_a_slightly_changed_loss_breaks_the_golden_curve(tmp_path):
    """The tolerance sees a small real change (the module docstring lists the others tried)."""
    want = json.loads(GOLDEN.read_text())["steps"]
    assert compare(run_curve(tmp_path, decay_gamma=4.2), want)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        steps = run_curve(Path(d))
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({
        "what": "tests/test_golden_loss.py: 10 steps of a tiny random DSpark draft on CPU (float32, 1 thread)",
        "torch": torch.__version__, "steps": steps}, indent=1) + "\n")
    print(f"wrote {GOLDEN}: loss {steps[0]['loss']:.6f} -> {steps[-1]['loss']:.6f}", file=sys.stderr)
