"""Draft ranks read only the embedding and lm_head from the target's safetensors: tied and
untied, one file or sharded, renamed (GPT-NeoX) or nested (Gemma-3 multimodal) names, and never
the whole model."""

import pytest
import torch
import transformers as tf

from splitserve.config import DraftConfig, TargetConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.target.shared_weights import SharedWeightsTarget, find_key, read_shared_weights

V = 64
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
MULTIMODAL_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         image_size=28, patch_size=14)

CASES = {
    "llama-tied": (lambda: tf.LlamaConfig(**SMALL, tie_word_embeddings=True), None),
    "llama-sharded": (lambda: tf.LlamaConfig(**SMALL, tie_word_embeddings=False), "20KB"),
    "gpt-neox": (lambda: tf.GPTNeoXConfig(**{k: v for k, v in SMALL.items() if k != "num_key_value_heads"}), None),
    "gemma3-multimodal": (lambda: tf.Gemma3Config(text_config=dict(SMALL, head_dim=8, tie_word_embeddings=False),
                                                  vision_config=MULTIMODAL_VISION, mm_tokens_per_image=4), "50KB"),
}


@pytest.fixture(params=sorted(CASES))
def saved(request, tmp_path):
    make, shard = CASES[request.param]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(make())
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    return model, TargetConfig(name=request.param, path=str(tmp_path), device="cpu", layer_ids=[0])


def test_reads_exactly_the_models_shared_tensors(saved, monkeypatch):
    model, cfg = saved

    def no_weights(*a, **k):
        raise AssertionError("the whole model was loaded")

    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", no_weights)
    embed, head = read_shared_weights(cfg)
    assert torch.equal(embed, model.get_input_embeddings().weight)  # same bytes, read back
    assert torch.equal(head, model.get_output_embeddings().weight)


def test_prefixes_match_by_tail_and_shape():
    ckpt = {"language_model.model.embed_tokens.weight": "a", "language_model.lm_head.weight": "a",
            "vision_tower.embeddings.patch_embedding.weight": "a"}
    candidates = {k: k for k in ckpt if "vision" not in k}
    want = "language_model.model.embed_tokens.weight"
    assert find_key("model.language_model.embed_tokens.weight", candidates) == want
    assert find_key("lm_head.weight", candidates) == "language_model.lm_head.weight"
    assert find_key("model.norm.weight", candidates) is None  # one shared component ("weight") is not a match


def test_stand_in_builds_the_same_draft_as_the_full_target(tiny_smol_dir, monkeypatch):
    from splitserve.target.hf import load_hf_target

    cfg = TargetConfig(name="tiny-smol", path=str(tiny_smol_dir), device="cpu", layer_ids=[0, 1, 2])
    full = load_hf_target(cfg)
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: 1 / 0)
    light = SharedWeightsTarget(cfg)
    assert light.info == full.info
    arch_full = resolve_arch(DraftConfig(num_layers=1), full.info, full.config, full.tokenizer)
    arch_light = resolve_arch(DraftConfig(num_layers=1), light.info, light.config, light.tokenizer)
    assert arch_full == arch_light
    torch.manual_seed(0)
    a = build_draft(arch_full, full)
    torch.manual_seed(0)
    b = build_draft(arch_light, light)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


@pytest.mark.parametrize("arch", ["qwen3-next", "qwen3.5-moe", "kimi-linear", "ling", "nemotron-h", "falcon-h1",
                                  "mamba2", "deepseek-v3", "gpt-oss"])
def test_draft_ranks_read_a_hybrid_targets_two_tensors(arch, tmp_path, monkeypatch):
    """A split job's draft ranks on a hybrid, recurrent, MLA or sink target read its embedding and
    lm_head from the checkpoint alone, equal to the loaded model's."""
    from arch_matrix import save_tiny

    save_tiny(arch, tmp_path)
    model = tf.AutoModelForCausalLM.from_pretrained(tmp_path)
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: 1 / 0)
    embed, head = read_shared_weights(TargetConfig(name=arch, path=str(tmp_path), device="cpu", layer_ids=[0, 1, 2]))
    assert torch.equal(embed, model.get_input_embeddings().weight)
    assert torch.equal(head, model.get_output_embeddings().weight)


def test_a_served_draft_shares_the_targets_embedding_and_head(tiny_smol_dir, tmp_path):
    """load_models (serve, bench, eval) points the draft's frozen copies of the target's
    embedding and lm_head at the target's own tensors, so they sit in memory once; the trained
    weights stay the draft's own, a copy that differs from the target's is left alone, and
    casting the draft afterwards leaves the target as it was."""
    from tiny import export_tiny_draft

    from splitserve.config import ModelsConfig
    from splitserve.loading import load_models, share_target_weights

    draft_dir = export_tiny_draft(tiny_smol_dir, tmp_path / "draft")
    target, draft = load_models(ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu",
                                             dtype="float32"))
    embed, head = target.embed_weight(), target.lm_head_weight()
    assert draft.embed_tokens.weight.data_ptr() == embed.data_ptr()
    assert draft.lm_head.weight.data_ptr() == head.data_ptr()
    targets = {embed.data_ptr(), head.data_ptr()}
    own = [p for p in draft.parameters() if p.requires_grad]  # the trained weights
    assert own and all(p.data_ptr() not in targets for p in own)
    assert share_target_weights(draft, target) == 0  # already shared: nothing more to free

    changed = draft.embed_tokens.weight.detach().clone()
    changed[0, 0] += 1.0
    draft.embed_tokens.weight = torch.nn.Parameter(changed, requires_grad=False)
    share_target_weights(draft, target)
    assert draft.embed_tokens.weight.data_ptr() == changed.data_ptr()  # not bit-equal to the target's: kept

    draft.double()
    assert embed.dtype == head.dtype == torch.float32 and draft.embed_tokens.weight.dtype == torch.float64


def test_the_draft_shares_before_it_moves_so_the_device_never_holds_its_copy(tiny_smol_dir, tmp_path, monkeypatch):
    """load_models shares the frozen copies while the draft is still as loaded (float32 on the
    host), before its cast and move to the target's device and dtype: at the 8B shape the move
    would otherwise put two 1.2 GB copies on the GPU for a moment. A float32 copy equal to the
    bf16 target's tensor once cast is shared, and the cast then leaves it as it is."""
    from tiny import export_tiny_draft

    import splitserve.loading as loading
    from splitserve.config import ModelsConfig

    draft_dir = export_tiny_draft(tiny_smol_dir, tmp_path / "draft")
    seen = []
    real = loading.share_target_weights

    def record(draft, target, before_move=False):
        seen.append((draft.embed_tokens.weight.dtype, before_move))
        return real(draft, target, before_move)

    monkeypatch.setattr(loading, "share_target_weights", record)
    target, draft = loading.load_models(ModelsConfig(draft=str(draft_dir), target=str(tiny_smol_dir), device="cpu",
                                                     dtype="bfloat16"))
    assert seen == [(torch.float32, True)]  # once, on the draft as loaded
    assert draft.embed_tokens.weight.dtype == torch.bfloat16
    assert draft.embed_tokens.weight.data_ptr() == target.embed_weight().data_ptr()
    assert draft.lm_head.weight.data_ptr() == target.lm_head_weight().data_ptr()
    assert all(p.dtype == torch.bfloat16 for p in draft.parameters())
