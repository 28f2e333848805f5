"""target.layer_rule: the named capture rules. The default EAGLE-3 draft captures EAGLE-3's
layers [1, N//2 - 1, N - 4] exactly; DSpark's spread rule keeps its numbers."""

import pytest
from transformers import LlamaConfig

from splitserve.config import TargetConfig, compose
from splitserve.errors import UserError
from splitserve.models.eagle3 import eagle3_layer_ids
from splitserve.target.hf import peek_target_info
from splitserve.target.layers import capture_layer_ids, default_layer_ids, rule_layer_ids


def _target_dir(tmp_path, layers: int):
    """A config.json alone (no weights): what peek_target_info and the checks read."""
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(tmp_path)
    return str(tmp_path)


def test_the_eagle3_draft_captures_the_conventions_layers(tmp_path):
    target = compose(["draft=eagle3"]).target
    assert target.layer_rule == "eagle3"
    assert capture_layer_ids(target, 36) == eagle3_layer_ids(36) == [1, 17, 32]  # Qwen3-8B
    assert capture_layer_ids(target, 32) == [1, 15, 28]
    # through the target's own resolution (what training records as arch.target_layer_ids)
    info = peek_target_info(TargetConfig(path=_target_dir(tmp_path, 36), layer_rule=target.layer_rule))
    assert info.layer_ids == (1, 17, 32)
    # as the engines write them: speculators / vLLM +1 (hidden_states indices), SGLang as ours
    assert [i + 1 for i in info.layer_ids] == [2, 36 // 2, 36 - 3]


def test_dspark_keeps_the_spread_rule_and_its_numbers():
    for overrides in ([], ["draft=dspark_b16"], ["draft=dflash_b8"]):
        target = compose(overrides).target
        assert target.layer_rule == "spread"
        assert capture_layer_ids(target, 36) == default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert rule_layer_ids(36, 3) == [1, 17, 33]  # what draft=eagle3 captured before its rule


def test_named_layers_win_over_the_rule():
    target = compose(["draft=eagle3", "target.layer_ids=[1,2,4]"]).target
    assert capture_layer_ids(target, 36) == [1, 2, 4]


@pytest.mark.parametrize("layers, found", [(6, "gives [1, 2, 2], repeating layer(s) [2]"),
                                           (4, "needs at least 6 layers")])
def test_a_rule_that_does_not_fit_is_refused_in_one_line(tmp_path, layers, found):
    from splitserve.checks import check_target_layers

    target = compose(["draft=eagle3", f"target.path={_target_dir(tmp_path, layers)}"]).target
    with pytest.raises(UserError) as err:
        check_target_layers(target)  # before any weight is read
    msg = str(err.value)
    assert "\n" not in msg and f"target.layer_rule=eagle3 does not fit a {layers}-layer target" in msg
    assert found in msg and "target.layer_ids=[...]" in msg
    with pytest.raises(UserError, match=r"^target.layer_rule='middle': must be one of spread, eagle3, last$"):
        rule_layer_ids(36, 3, "middle")
