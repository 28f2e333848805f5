"""The EAGLE-3 draft (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test", 2025): an autoregressive draft over fused target features.

    g_t = fc([H^(low)_t ; H^(mid)_t ; H^(high)_t])       three captured target layers, 3D -> D
    layer 0 attends over [RMSNorm(e(x_{t+1})) ; RMSNorm(g_t)] (2D), residual g_t
    h_t   = decoder layers -> the draft's state; logits = lm_head(norm(h_t)) over N draft tokens

Position t reads the token x_{t+1} at RoPE position t+1 with the target's state at t, and
predicts x_{t+2}. Drafting a chain, step j > 0 reads the token drafted by step j-1 with the
draft's own state h from step j-1 in place of g (the target has not seen that token yet).
Training-time test (`unroll`) trains exactly this: k steps over every position at once, step j
reading step j-1's states, with the mask of `ttt_mask` so that each position sees what a chain
started there would see. The lm_head covers a reduced vocabulary (models/vocab_map.py): d2t
maps its ids to the target's.

Captured layers. `arch.target_layer_ids` are our capture's ids (TargetInfo.layer_ids: the
output of layer l, HF hidden_states[l + 1]). EAGLE-3's common choice (`eagle3_layer_ids`) is
[1, N//2 - 1, N - 4] in these ids; speculators and vLLM write the same layers as the
hidden_states indices [2, N//2, N - 3] (the input of layer l + 1), SGLang and SpecForge as
[1, N//2 - 1, N - 4] (SGLang adds the 1 itself). Exports must convert accordingly.

Plain nn.Module, Llama-style layers (no q/k norm, as the engines' EAGLE-3 layers). Glossary:
B batch, T tokens, U = T-1 positions, S cached key positions, D hidden, V target vocab,
N draft vocab, m captured layers, k training-time-test steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from splitserve.models.families import ArchRecord
from splitserve.models.layers import RMSNorm, Rotary, SwiGLU, apply_rotary
from splitserve.models.vocab_map import VocabMap


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's usual low/mid/high layers of an N-layer target, in our capture's ids (the
    output of layer l): [1, N//2 - 1, N - 4]; Qwen3-8B (N=36): [1, 17, 32]."""
    if num_layers < 6:
        raise ValueError(f"EAGLE-3's layer rule needs a target of at least 6 layers, got {num_layers}")
    return [1, num_layers // 2 - 1, num_layers - 4]


@dataclass(frozen=True)
class Eagle3Arch(ArchRecord):
    """Fully resolved EAGLE-3 architecture, plus the target identity."""

    vocab_size: int  # V: the target's
    hidden_size: int
    num_layers: int  # decoder layers; the first reads [embedding ; state] (EAGLE-3 has one)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    draft_vocab_size: int  # N
    ttt_steps: int = 3  # k: the training-time-test depth it was trained with
    target_name: str = ""
    target_num_layers: int = 0

    @property
    def aux_dim(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    @property
    def block_size(self) -> int:
        """γ: the tokens a served round drafts, one chain step each; the depth it was trained to
        chain (speculative/eagle3_chain.py)."""
        return self.ttt_steps


class Eagle3Cache:
    """Per layer keys and values of the positions read so far, each (B, Hkv, S, hd), RoPE applied.
    A chain appends one position per step; `crop` drops rejected ones."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        return next(iter(self.kv.values()))[0].shape[2] if self.kv else 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, Hkv, Q, hd) -> every cached key and value of the layer, (B, Hkv, S+Q, hd)."""
        if layer in self.kv:
            old_k, old_v = self.kv[layer]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.kv[layer] = (k, v)
        return k, v

    def crop(self, length: int) -> None:
        self.kv = {i: (k[:, :, :length], v[:, :, :length]) for i, (k, v) in self.kv.items()}


def ttt_mask(u: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """The training-time-test mask of step j over the keys of steps 0..j, (1, 1, U, (j+1)U) bool.

    Query t of step j stands for the j-th token of a chain started at position t. Such a chain
    sees the positions read from the target up to t (step 0's keys s <= t: causal) and its own
    earlier tokens, which sit at position t of steps 1..j (the diagonal of those blocks)."""
    causal = torch.ones(u, u, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(u, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * step, dim=1)[None, None]


def chunk_mask(q_len: int, past: int, device: torch.device | None = None) -> torch.Tensor | None:
    """Q new positions after S cached ones: each sees the cache and the new ones up to itself,
    (1, 1, Q, S+Q) bool; None for one position (it sees everything)."""
    if q_len == 1:
        return None
    cols = torch.arange(past + q_len, device=device)
    return (cols[None, :] <= past + torch.arange(q_len, device=device)[:, None])[None, None]


class Eagle3Attention(nn.Module):
    """Llama self-attention whose projections may read a wider input (2D in the first layer)."""

    def __init__(self, in_dim: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x, cos, sin, cache: Eagle3Cache, layer: int, mask: torch.Tensor | None) -> torch.Tensor:
        """x: (B, Q, in_dim); mask: (B or 1, 1, Q, S+Q) bool or None -> (B, Q, D); appends to cache."""
        b, q_len, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, q_len, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, q_len, self.n_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, q_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k, v = cache.append(layer, k, v)  # (B, Hkv, S+Q, hd)
        if mask is not None and self.training and self.n_heads != self.n_kv_heads:
            # As InjectedAttention: with a mask, CUDA's SDPA serves grouped K/V only with its math
            # kernel (fp32 scores kept for backward); repeated K/V reach the memory-efficient one.
            rep = self.n_heads // self.n_kv_heads
            out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                 attn_mask=mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class Eagle3Layer(nn.Module):
    """Pre-norm decoder layer. The first reads [input_layernorm(e) ; hidden_norm(h)] and keeps
    the un-normed h as its residual (EAGLE-3's midlayer); later ones are plain Llama layers."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int, eps: float, first: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.hidden_norm = RMSNorm(dim, eps) if first else None
        self.self_attn = Eagle3Attention(2 * dim if first else dim, dim, n_heads, n_kv_heads, head_dim)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = SwiGLU(dim, ffn)

    def forward(self, h, emb, cos, sin, cache: Eagle3Cache, layer: int, mask) -> torch.Tensor:
        """h, emb: (B, Q, D) -> (B, Q, D)."""
        if self.hidden_norm is not None:
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)  # (B, Q, 2D)
        else:
            x = self.input_layernorm(h)
        h = h + self.self_attn(x, cos, sin, cache, layer, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    confidence = None  # no confidence head: a served round verifies its whole chain
    drafting = "chain"  # served by the chain drafters (speculative/eagle3_chain.py)

    def __init__(self, arch: Eagle3Arch):
        super().__init__()
        self.arch = a = arch
        # Frozen, copied from the target (`load_shared`): the token embedding, and the target's
        # lm_head, which training needs for the target's distribution (it never runs in a chain).
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.target_lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        # Trained.
        self.fc = nn.Linear(a.aux_dim, a.hidden_size, bias=False)
        self.layers = nn.ModuleList(
            Eagle3Layer(a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim, a.intermediate_size, a.rms_norm_eps,
                        first=i == 0)
            for i in range(a.num_layers)
        )
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden_size, a.draft_vocab_size, bias=False)  # N rows, from the target's
        self.rotary = Rotary(a.head_dim, a.rope_theta)
        first = VocabMap.first(a.draft_vocab_size, a.vocab_size)  # until the data is counted (`set_vocab`)
        self.register_buffer("d2t", first.d2t)
        self.register_buffer("t2d", first.t2d)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and "lm_head" not in name:
                nn.init.normal_(module.weight, std=0.02)
        self.embed_tokens.requires_grad_(False)
        self.target_lm_head.requires_grad_(False)

    @property
    def vocab(self) -> VocabMap:
        return VocabMap(self.d2t, self.t2d)

    @torch.no_grad()
    def load_shared(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's embedding and lm_head (both (V, D)); the draft's lm_head starts as
        the target's rows of its vocabulary."""
        for name, w, slot in (("embedding", embed_weight, self.embed_tokens),
                              ("lm_head", lm_head_weight, self.target_lm_head)):
            if tuple(w.shape) != tuple(slot.weight.shape):
                raise ValueError(f"target {name} has shape {tuple(w.shape)}, draft expects {tuple(slot.weight.shape)}")
            slot.weight.copy_(w.to(slot.weight.dtype))
        self.lm_head.weight.copy_(self.target_lm_head.weight[self.vocab.used])

    @torch.no_grad()
    def set_vocab(self, vocab: VocabMap) -> None:
        """Adopt a draft vocabulary; the lm_head restarts from the target's rows of it."""
        if vocab.size != self.arch.draft_vocab_size or vocab.t2d.numel() != self.arch.vocab_size:
            raise ValueError(f"a vocabulary map of {vocab.size} of {vocab.t2d.numel()} ids does not fit this draft "
                             f"({self.arch.draft_vocab_size} of {self.arch.vocab_size})")
        vocab.check()
        self.d2t.copy_(vocab.d2t)
        self.t2d.copy_(vocab.t2d)
        self.lm_head.weight.copy_(self.target_lm_head.weight[self.vocab.used])

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything but the frozen shared weights; the vocabulary map (d2t, t2d) included."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed_tokens.", "target_lm_head."))}

    # ---- one forward over new positions (a chain step, a prefill, one TTT step) ----------------

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux: (B, T, m*D) the captured target layers -> g: (B, T, D)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def backbone(self, hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                 cache: Eagle3Cache, mask: torch.Tensor | None = None, step: int = 0) -> torch.Tensor:
        """hidden: (B, Q, D) fused target states or the draft's previous states; token_ids,
        positions: (B, Q); mask: (B or 1, 1, Q, S+Q) bool, None: `chunk_mask`; step: the chain
        step (every step runs the same layers) -> h: (B, Q, D), the draft's states (pre-norm:
        what the next step reads). Appends Q positions to cache."""
        if mask is None:
            mask = chunk_mask(token_ids.shape[1], cache.length, token_ids.device)
        emb = self.embed_tokens(token_ids)
        cos, sin = self.rotary(positions)
        h = hidden
        for i, layer in enumerate(self.layers):
            h = layer(h, emb, cos, sin, cache, i, mask)
        return h

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., D) -> (..., N) logits over the draft vocabulary."""
        return self.lm_head(self.norm(h))

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """(..., N) -> (..., V) indexed by target id; -inf where the draft vocabulary has no token."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.arch.vocab_size), float("-inf"))
        return out.index_copy(-1, self.vocab.used, draft_logits)

    def step(self, hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
             cache: Eagle3Cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain drafting: read Q new tokens (a prefill's or one drafted token) after the cache.
        hidden: (B, Q, D) `fuse`d target states or the previous step's h; token_ids, positions:
        (B, Q) -> logits over target ids (B, Q, V) and the states h (B, Q, D) the next step reads."""
        h = self.backbone(hidden, token_ids, positions, cache)
        return self.target_logits(self.draft_logits(h)), h

    # ---- training-time test ------------------------------------------------------------------

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """aux: (B, T, m*D), input_ids: (B, T) -> k states (B, U, D), U = T-1 (`unroll_chain`)."""
        return unroll_chain(self, aux, input_ids, steps)


def unroll_chain(draft, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The training-time test of a chain draft (Eagle3Draft, models/mtp.py MtpDraft): aux (B, T, ·)
    its target features, input_ids (B, T) -> k states (B, U, D), U = T-1.

    Step j at position t reads token x_{t+1+j} at RoPE position t+1+j with step j-1's state at t
    (step 0: the target's at t), and predicts x_{t+2+j}: the j-th step of a chain started after
    the target's position t, teacher-forced. Tokens past the end are id 0; their rows are seen
    only by themselves (`ttt_mask`), and the loss drops them."""
    b, t = input_ids.shape
    u = t - 1
    hidden = draft.fuse(aux[:, :u])  # (B, U, D)
    ids = torch.cat([input_ids, input_ids.new_zeros(b, steps)], dim=1)  # (B, T+k)
    pos = torch.arange(1, u + 1, device=input_ids.device).expand(b, u)  # (B, U)
    cache, states = Eagle3Cache(), []
    for j in range(steps):
        hidden = draft.backbone(hidden, ids[:, 1 + j: 1 + j + u], pos + j, cache, ttt_mask(u, j, ids.device), step=j)
        states.append(hidden)
    return states
