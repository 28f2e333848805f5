"""Default captured layers, and the one-way dependency rule for the model code."""

import ast
from pathlib import Path

import pytest

from splitserve.target.layers import check_layer_ids, default_layer_ids

PKG = Path(__file__).resolve().parents[1] / "splitserve"


def test_default_layer_rule():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B, DSPARK.md
    assert default_layer_ids(30, 5) == [1, 8, 14, 21, 27]  # SmolLM2-135M: halves round up
    for n in (4, 6, 30, 64):
        ids = default_layer_ids(n, 5)
        assert max(ids) < n - 1, "the last layer is never captured"


def test_layer_ids_validation():
    with pytest.raises(ValueError, match="out of range"):
        check_layer_ids([1, 29], 30)


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
