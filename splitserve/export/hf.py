"""Hugging Face face of the draft: a config class and a PreTrainedModel that wraps DSparkDraft.

`import splitserve.export` registers both, so `AutoConfig.from_pretrained(dir)` and
`AutoModel.from_pretrained(dir)` load an exported draft. The wrapper only adapts: weights live
under `model.` exactly as in DSparkDraft, and forward returns the Markov-corrected logits of
one block (teacher-forced), which the round-trip test compares.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import torch
from transformers import PretrainedConfig, PreTrainedModel

from splitserve.models.dspark import DSparkArch, DSparkDraft

MODEL_TYPE = "dspark"
# DSparkArch field -> config.json key, where HF naming conventions differ.
_HF_NAME = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "target_num_layers": "num_target_layers",
}
ARCHITECTURE = "DSparkDraftModel"


def required_config_keys() -> list[str]:
    """config.json keys of the DSparkArch fields that have no default: an export must state them."""
    return [_HF_NAME.get(f.name, f.name) for f in fields(DSparkArch) if f.default is MISSING]


class DSparkConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 512,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 8,
        head_dim: int = 64,
        intermediate_size: int = 1024,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        block_size: int = 8,
        mask_token_id: int = 0,
        target_layer_ids: list[int] | None = None,
        markov_rank: int = 256,
        markov_head_type: str = "vanilla",
        enable_confidence_head: bool = True,
        target_name: str = "",
        target_vocab_size: int | None = None,
        target_hidden_size: int | None = None,
        num_target_layers: int = 0,
        confidence_temperatures: list[float] | None = None,
        context_window: int = 0,
        draft_vocab_size: int = 0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.target_layer_ids = list(target_layer_ids or [])
        self.markov_rank = markov_rank
        self.markov_head_type = markov_head_type
        self.enable_confidence_head = enable_confidence_head
        self.context_window = context_window
        # 0 < N < vocab_size: a reduced head over N tokens, its map (d2t, t2d) in the weights
        self.draft_vocab_size = draft_vocab_size
        # The target's identity: a draft is refused by any other target.
        self.target_name = target_name
        self.target_vocab_size = target_vocab_size if target_vocab_size is not None else vocab_size
        self.target_hidden_size = target_hidden_size if target_hidden_size is not None else hidden_size
        self.num_target_layers = num_target_layers
        # STS temperatures of the confidence head, one per block position (calibration.json
        # beside this file has the fit for every sampling temperature): c_k = sigmoid(z_k / T_k).
        self.confidence_temperatures = list(confidence_temperatures) if confidence_temperatures else None
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @classmethod
    def from_arch(cls, arch: DSparkArch) -> "DSparkConfig":
        kwargs = {_HF_NAME.get(f.name, f.name): getattr(arch, f.name) for f in fields(DSparkArch)}
        kwargs["target_layer_ids"] = list(arch.target_layer_ids)
        return cls(architectures=[ARCHITECTURE], **kwargs)

    def to_arch(self) -> DSparkArch:
        kwargs = {f.name: getattr(self, _HF_NAME.get(f.name, f.name)) for f in fields(DSparkArch)}
        kwargs["target_layer_ids"] = tuple(kwargs["target_layer_ids"])
        return DSparkArch(**kwargs)


class DSparkDraftModel(PreTrainedModel):
    config_class = DSparkConfig
    base_model_prefix = "model"

    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        self.model = DSparkDraft(config.to_arch())
        self.post_init()

    def _init_weights(self, module):  # weights always come from the checkpoint
        pass

    def forward(
        self,
        aux_hidden: torch.Tensor,
        block_ids: torch.Tensor,
        anchor_pos: int | None = None,
    ) -> torch.Tensor:
        """One teacher-forced block after a context.

        aux_hidden: (1, C, m*D) the target's captured hidden states for positions 0..C-1
        block_ids:  (1, γ) [anchor, x*_1 .. x*_{γ-1}]: the anchor sits at position C unless
                    `anchor_pos` says otherwise; the backbone input masks all but the anchor
        returns     (1, γ, N) Markov-corrected draft logits (N = V unless the draft vocabulary is reduced)
        """
        c = aux_hidden.shape[1]
        anchor_pos = c if anchor_pos is None else anchor_pos
        ctx_pos = torch.arange(c, device=aux_hidden.device)[None]
        ctx_kv = self.model.context_kv(aux_hidden, ctx_pos)
        inputs = self.model.block_inputs(block_ids[:, 0])
        pos = torch.arange(anchor_pos, anchor_pos + inputs.shape[1], device=aux_hidden.device)[None]
        h = self.model.backbone(inputs, pos, ctx_kv, None)
        return self.model.logits(h, block_ids)


def register() -> None:
    from transformers import AutoConfig, AutoModel

    try:
        AutoConfig.register(MODEL_TYPE, DSparkConfig)
        AutoModel.register(DSparkConfig, DSparkDraftModel)
    except ValueError:  # already registered
        pass
