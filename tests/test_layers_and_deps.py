"""Default captured layers, and the one-way dependency rule for the model code."""

import ast
from pathlib import Path

import pytest

from splitserve.target.layers import check_layer_ids, default_layer_ids, max_default_layers

PKG = Path(__file__).resolve().parents[1] / "splitserve"


def test_default_layer_rule():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B, DSPARK.md
    assert default_layer_ids(30, 5) == [1, 8, 14, 21, 27]  # SmolLM2-135M: halves round up
    for n in (4, 6, 30, 64):
        ids = default_layer_ids(n, 5)
        assert max(ids) < n - 1, "the last layer is never captured"


def test_layer_ids_validation():
    from splitserve.errors import UserError  # a user's setting: one line at the CLI, no traceback

    with pytest.raises(UserError, match="target.layer_ids .* out of range"):
        check_layer_ids([1, 29], 30)


def test_a_rule_that_repeats_a_layer_is_refused_naming_the_fix():
    from splitserve.errors import UserError

    assert default_layer_ids(4, 5) == [1, 1, 1, 1, 1]  # the rule itself is unchanged; its use is refused
    assert [max_default_layers(n) for n in (2, 3, 4, 5, 6, 30, 36)] == [1, 2, 1, 2, 3, 27, 33]
    with pytest.raises(UserError) as err:
        check_layer_ids(default_layer_ids(4, 5), 4, from_rule=True)
    msg = str(err.value)
    assert "\n" not in msg and "4-layer target" in msg and "[1, 1, 1, 1, 1]" in msg
    assert "target.num_capture_layers=K with K <= 1" in msg and "target.layer_ids=[...]" in msg
    with pytest.raises(UserError, match=r"default capture rule gives layer ids \[1, 1, 1, 1, 1\]"):
        check_layer_ids([1, 1, 1, 1, 1], 4)  # where the ids came from is inferred when not said
    with pytest.raises(UserError, match=r"target.layer_ids \[0, 2, 2\] repeat layer\(s\) \[2\] of a 4-layer target"):
        check_layer_ids([0, 2, 2], 4)
    for n in (8, 30, 36, 64):  # wherever the rule fits, it still passes
        check_layer_ids(default_layer_ids(n, 5), n, from_rule=True)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_model_code_has_no_distributed_or_training_imports():
    for f in (PKG / "models").glob("*.py"):
        for name in _imports(f):
            assert not name.startswith(("torch.distributed", "deepspeed", "splitserve.train.loop", "hydra")), (f, name)


def test_records_depend_on_nothing_in_the_package():
    assert not [n for n in _imports(PKG / "records.py") if n.startswith("splitserve")]


def test_varlen_sdpa_excludes_cudnn_and_keeps_results():
    """Training and capture run SDPA without cuDNN (per-shape plans); the math is unchanged."""
    import torch
    import torch.nn.functional as F

    from splitserve.target.sdpa import varlen_sdpa

    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with varlen_sdpa():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref)


def test_training_attention_repeats_grouped_kv_under_a_mask_and_computes_the_same(monkeypatch):
    """With a mask, training hands SDPA K/V repeated to the query heads (CUDA serves grouped K/V
    plus a mask only with its math kernel); serving keeps `enable_gqa`. Same outputs and grads."""
    import torch
    import torch.nn.functional as F

    from splitserve.models import layers
    from splitserve.models.layers import InjectedAttention, Rotary

    torch.manual_seed(0)
    attn = InjectedAttention(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, eps=1e-6)
    b, c, q_len = 2, 6, 5
    x, h_ctx = torch.randn(b, q_len, 32), torch.randn(b, c, 32)
    cos, sin = Rotary(8, 10000.0)(torch.arange(c + q_len).expand(b, -1))
    mask = torch.rand(b, 1, q_len, c + q_len) > 0.3
    mask[..., c:] = True  # every position sees its block

    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((k.shape[1], kw.get("enable_gqa", False)))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)

    def run(training: bool):
        attn.train(training)
        attn.zero_grad()
        ctx_k, ctx_v = attn.project_context(h_ctx, cos[:, :, :c], sin[:, :, :c])
        out = attn(x, ctx_k, ctx_v, cos[:, :, c:], sin[:, :, c:], mask)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in attn.parameters()]

    out_train, grads_train = run(True)
    out_eval, grads_eval = run(False)
    assert seen == [(4, False), (2, True)]
    torch.testing.assert_close(out_train, out_eval)
    for g_train, g_eval in zip(grads_train, grads_eval):
        torch.testing.assert_close(g_train, g_eval)
