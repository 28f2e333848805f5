"""The DSpark draft: a parallel block backbone conditioned on the target by KV injection,
a Markov head for neighbouring-token dependency and a confidence head.

`markov_rank = 0` removes both the Markov bias and its features: the same class is then the
DFlash-style baseline (independent parallel drafting).

Reduced vocabulary (`draft_vocab_size = N`, 0 < N < V): the lm_head holds the target's rows of
the N most frequent trained tokens (models/vocab_map.py, as EAGLE-3's d2t), so a round's head
products read N rows instead of V. Its logits, the Markov bias W2 z and the sampled ids live in
the draft's N ids; W1 reads those ids plus one shared row for every target token outside them
(`head_ids`), and `draft` hands the round target ids and (γ, V) distributions that are zero off
the N tokens, so verification stays lossless. Training's target distribution comes from the
target's whole lm_head (`target_head`). N = 0 is the plain draft: no id is mapped.

Plain nn.Module: no distributed code, no HF base class (export wraps it, see export/hf.py).
Glossary: B batch, C context positions, Q block positions, γ block size, D hidden, V vocab,
N the draft's vocabulary (V unless reduced), m captured target layers, r Markov rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from splitserve.models.candidate_chain import candidate_chain, supports_candidates
from splitserve.models.families import ArchRecord
from splitserve.models.finite import finite_or_zero
from splitserve.models.heads import ConfidenceHead, MarkovHead
from splitserve.models.layers import DraftLayer, RMSNorm, Rotary
from splitserve.models.vocab_map import VocabMap, lookup


@dataclass(frozen=True)
class DSparkArch(ArchRecord):
    """Fully resolved draft architecture (no defaults left to guess), plus the target identity."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    context_window: int = 0  # W: the block reads context positions p-W..p-1 only; 0: all of them
    draft_vocab_size: int = 0  # N: the lm_head's tokens (0 < N < V: reduced); 0: the whole vocabulary
    target_name: str = ""
    target_num_layers: int = 0

    @property
    def aux_dim(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    @property
    def reduced(self) -> bool:
        return 0 < self.draft_vocab_size < self.vocab_size

    @property
    def head_vocab(self) -> int:
        """N: the logits' width."""
        return self.draft_vocab_size if self.reduced else self.vocab_size


class DSparkDraft(nn.Module):
    def __init__(self, arch: DSparkArch):
        super().__init__()
        self.arch = arch
        a = arch
        n = a.head_vocab
        # Frozen, copied from the target (`load_shared`); reduced, the lm_head is the target's
        # rows of the draft vocabulary and the whole one stays beside it for training.
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.lm_head = nn.Linear(a.hidden_size, n, bias=False)
        if a.reduced:
            self.target_lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
            self.target_lm_head.requires_grad_(False)
            first = VocabMap.first(n, a.vocab_size)  # until the data is counted (`set_vocab`)
            self.register_buffer("d2t", first.d2t)  # (N,) int64
            self.register_buffer("t2d", first.t2d)  # (V,) bool
            self.register_buffer("head_index", self._head_index(first), persistent=False)  # (V,)
            self.register_load_state_dict_post_hook(DSparkDraft._after_load)
        # Trained.
        self.fc = nn.Linear(a.aux_dim, a.hidden_size, bias=False)  # W_c
        self.ctx_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.layers = nn.ModuleList(
            DraftLayer(a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim, a.intermediate_size, a.rms_norm_eps)
            for _ in range(a.num_layers)
        )
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.rotary = Rotary(a.head_dim, a.rope_theta)
        self.markov = (
            MarkovHead(n, a.markov_rank, a.hidden_size, a.markov_head_type, in_vocab=n + a.reduced)
            if a.markov_rank > 0
            else None
        )
        self.confidence = ConfidenceHead(a.hidden_size, a.markov_rank) if a.enable_confidence_head else None
        self._init_trainable()
        self.embed_tokens.requires_grad_(False)
        self.lm_head.requires_grad_(False)

    def _init_trainable(self) -> None:
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name.startswith(("lm_head", "target_lm_head", "markov.w2")):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @torch.no_grad()
    def load_shared(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's token embedding and lm_head (both (V, D)) into the frozen slots."""
        pairs = (("embedding", embed_weight, self.embed_tokens), ("lm_head", lm_head_weight, self.target_head))
        for name, w, slot in pairs:
            if tuple(w.shape) != tuple(slot.weight.shape):
                raise ValueError(
                    f"target {name} has shape {tuple(w.shape)}, draft expects {tuple(slot.weight.shape)}"
                )
            slot.weight.copy_(w.to(slot.weight.dtype))
        if self.arch.reduced:
            self._select_rows()

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything but the frozen shared weights (these come back from the target); a reduced
        draft's vocabulary map (d2t, t2d) included."""
        frozen = ("embed_tokens.", "lm_head.", "target_lm_head.")
        return {k: v for k, v in self.state_dict().items() if not k.startswith(frozen)}

    # ---- vocabulary -----------------------------------------------------------------------

    @property
    def target_head(self) -> nn.Linear:
        """The target's own lm_head (V rows): training's target distribution."""
        return self.target_lm_head if self.arch.reduced else self.lm_head

    @property
    def vocab(self) -> VocabMap | None:
        """The reduced vocabulary's map (models/vocab_map.py); None for a whole-vocabulary draft."""
        return VocabMap(self.d2t, self.t2d) if self.arch.reduced else None

    @torch.no_grad()
    def set_vocab(self, vocab: VocabMap) -> None:
        """Adopt a draft vocabulary (a reduced draft only): the lm_head becomes the target's rows of it."""
        a = self.arch
        if not a.reduced or vocab.size != a.draft_vocab_size or vocab.t2d.numel() != a.vocab_size:
            raise ValueError(f"a vocabulary map of {vocab.size} of {vocab.t2d.numel()} ids does not fit this draft "
                             f"({a.head_vocab} of {a.vocab_size})")
        vocab.check()
        self.d2t.copy_(vocab.d2t)
        self.t2d.copy_(vocab.t2d)
        self._select_rows()

    @staticmethod
    def _head_index(vocab: VocabMap) -> torch.Tensor:
        """(V,) the draft id of every target id, N for a token outside the draft vocabulary."""
        ids = vocab.to_draft(torch.arange(vocab.t2d.numel(), device=vocab.t2d.device))
        return torch.where(ids < 0, vocab.size, ids)

    @torch.no_grad()
    def _select_rows(self) -> None:
        self.head_index.copy_(self._head_index(self.vocab))
        self.lm_head.weight.copy_(self.target_lm_head.weight[self.vocab.used])

    @staticmethod
    def _after_load(module: "DSparkDraft", incompatible) -> None:
        """A loaded map (a checkpoint's d2t, t2d) re-selects the lm_head's rows and the index."""
        module._select_rows()

    def head_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids (...) -> the ids W1 reads (...): the same ids, or for a reduced draft its
        own id of each, N for a token outside its vocabulary."""
        return lookup(self.head_index, ids) if self.arch.reduced else ids

    def to_target(self, head_ids: torch.Tensor) -> torch.Tensor:
        """The draft's ids (...) in 0..N-1 -> target ids (...)."""
        return head_ids + lookup(self.d2t, head_ids) if self.arch.reduced else head_ids

    def spread(self, probs: torch.Tensor) -> torch.Tensor:
        """(..., N) distributions over the draft's ids -> (..., V) over the target's, zero off the
        draft vocabulary (the rejection rule then draws those tokens from the residual only)."""
        if not self.arch.reduced:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.arch.vocab_size)
        return out.index_copy_(-1, self.vocab.used, probs)

    # ---- backbone -------------------------------------------------------------------------

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """aux: (B, C, m*D), positions: (B, C) -> per layer (k, v), each (B, Hkv, C, hd).

        H_ctx = RMSNorm(W_c [H^(l1); ...; H^(lm)]): context features are never input tokens.
        """
        # The draft's own dtype from ctx_norm, not fc: a served FP8 fc has no weight in that dtype,
        # and a float32 aux would run its product and everything after it in float32.
        h_ctx = self.ctx_norm(self.fc(aux.to(self.ctx_norm.weight.dtype)))
        cos, sin = self.rotary(positions)
        return [layer.self_attn.project_context(h_ctx, cos, sin) for layer in self.layers]

    def backbone(
        self,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """block_ids, block_pos: (B, Q); mask: (B, 1, Q, C+Q) bool or None -> h: (B, Q, D), normed."""
        x = self.embed_tokens(block_ids)
        cos, sin = self.rotary(block_pos)
        for layer, (ctx_k, ctx_v) in zip(self.layers, ctx_kv):
            x = layer(x, ctx_k, ctx_v, cos, sin, mask)
        return self.norm(x)

    def backbone_cached(self, block_ids: torch.Tensor, block_pos: torch.Tensor,
                        cache_kv: list[tuple[torch.Tensor, torch.Tensor]], window: int, attend) -> torch.Tensor:
        """Serving (batch 1): block_ids, block_pos (1, Q); cache_kv: per layer the static context
        cache (1, Hkv, L, hd), slot = position -> h (1, Q, D), normed. The block's K/V land in the
        cache at its positions (slots the next context write overwrites); `attend` reads the cache
        in place (layers.Attend)."""
        x = self.embed_tokens(block_ids)
        cos, sin = self.rotary(block_pos)
        slots = block_pos[0]
        for layer, (k_cache, v_cache) in zip(self.layers, cache_kv):
            x = layer.forward_cached(x, k_cache, v_cache, slots, cos, sin, window, attend)
        return self.norm(x)

    def block_inputs(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """anchor_ids: (...) -> (..., γ): the anchor followed by γ-1 mask tokens."""
        masks = anchor_ids.new_full((*anchor_ids.shape, self.arch.block_size - 1), self.arch.mask_token_id)
        return torch.cat([anchor_ids[..., None], masks], dim=-1)

    # ---- heads ----------------------------------------------------------------------------

    def markov_latent(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        """Teacher-forced blocks. h: (..., γ, D), prev_ids: (..., γ) target ids -> z: (..., γ, r),
        or None without a Markov head. prev_ids are [x0, x*_1 .. x*_{γ-1}] for each block."""
        return None if self.markov is None else self.markov.latent(self.head_ids(prev_ids), h)

    def head_logits(self, h: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """U + W2 z. h: (..., D), z: (..., r) or None -> (..., N) over the draft's ids."""
        u = self.lm_head(h)
        return u if z is None else u + self.markov.w2(z)

    def logits(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Markov-corrected draft logits of teacher-forced blocks. h: (..., γ, D), prev_ids: (..., γ)
        target ids -> (..., γ, N)."""
        return self.head_logits(h, self.markov_latent(h, prev_ids))

    def confidence_logit(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        """h: (..., D), prev_ids: (...) target ids -> logit of c_k: (...), or None without a confidence head."""
        return self._confidence(h, self.head_ids(prev_ids))

    def _confidence(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """As confidence_logit, prev (...) in the ids W1 reads (`head_ids`)."""
        if self.confidence is None:
            return None
        feats = self.markov.features(prev) if self.markov is not None else None
        return self.confidence(h, feats)

    # ---- inference: one draft round -------------------------------------------------------

    @torch.no_grad()
    def draft(
        self,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchor_id: torch.Tensor,
        anchor_pos: int | torch.Tensor,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        ctx_mask: torch.Tensor | None = None,
        markov_topk: int = 0,
        markov_kernel: bool = True,
        attend=None,
        window: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Draft γ tokens after the anchor.

        ctx_kv: context K/V (batch 1), each (1, Hkv, C, hd).
        anchor_id: () the last token the target produced (not yet seen by the target).
        anchor_pos: its position, an int or a () device tensor (static serving: no host sync).
        ctx_mask: None when ctx_kv holds exactly the committed positions before the anchor;
        else (1, 1, γ, C+γ) bool, which context slots the block may see (a preallocated
        context buffer holds stale and unwritten slots too).
        markov_topk: greedy only; K > 0 runs the Markov stage over each position's K best
        backbone candidates (models/candidate_chain.py: a few launches instead of 3 per
        position; identical tokens whenever each argmax lies among them). 0: the exact stage.
        markov_kernel: greedy exact stage with a vanilla head: one launch per position
        (models/markov_step_kernel.py; the loop's tokens but at a near tie of one ulp). False:
        the loop, for A/B measurement.
        attend: serving's cache attention (layers.Attend). Given, ctx_kv is the whole static
        context cache (slot = position, stale slots past the anchor allowed), ctx_mask is unused,
        and the block attends over the first `window` slots in place (`backbone_cached`).
        Returns tokens (γ,), draft probabilities (γ, V) at this temperature (None when greedy),
        confidence c_k (γ,) or None.
        """
        gamma = self.arch.block_size
        block_ids = self.block_inputs(anchor_id.view(1))  # (1, γ)
        pos = (anchor_pos + torch.arange(gamma, device=block_ids.device))[None]  # (1, γ)
        if attend is not None:
            h = self.backbone_cached(block_ids, pos, ctx_kv, window, attend)[0]  # (γ, D)
        else:
            h = self.backbone(block_ids, pos, ctx_kv, ctx_mask)[0]  # (γ, D)
        base = self.lm_head(h)  # (γ, N): U_k, computed in parallel
        first = self.head_ids(anchor_id)  # () the anchor as W1 reads it
        if temperature <= 0 and self.markov is None:  # no sequential stage: one argmax
            return self._finish(h, first, base.argmax(-1), None)
        if temperature <= 0 and 0 < markov_topk < base.shape[-1] and supports_candidates(self.markov):
            return self._finish(h, first, candidate_chain(self.markov, base, h, first, markov_topk), None)
        if temperature <= 0 and markov_kernel and self.markov.kind == "vanilla":
            from splitserve.models.markov_step_kernel import markov_greedy_chain  # Triton on CUDA, else the reference

            tokens = markov_greedy_chain(base, self.markov.w1.weight, self.markov.w2.weight, first)
            return self._finish(h, first, tokens, None)
        if temperature > 0:  # a draw needs a finite distribution (finite.py says why)
            base, h = finite_or_zero(base, h)
        tokens = anchor_id.new_empty(gamma)
        probs = [] if temperature > 0 else None
        prev = first.view(1)
        state = self.markov.init_state(h[:1]) if self.markov is not None else None  # (1, r) for rnn
        # Sequential stage: x_k ~ softmax(U_k + B_k), B_k from x_{k-1} (and the rnn state), k = 1..γ.
        for k in range(gamma):
            logit = base[k]
            if self.markov is not None:
                state, z = self.markov.step(state, prev, h[k : k + 1])  # z: (1, r)
                logit = logit + self.markov.w2(z)[0]
            if temperature > 0:
                p = torch.softmax(logit.float() / temperature, dim=-1)
                tok = torch.multinomial(p, 1, generator=generator)
                probs.append(p)
            else:
                tok = logit.argmax(-1, keepdim=True)
            tokens[k] = tok[0]
            prev = tok
        return self._finish(h, first, tokens, torch.stack(probs) if probs is not None else None)

    def _finish(
        self, h: torch.Tensor, first: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Attach the confidences c_k, which see x_{k-1}: h (γ, D), first () and tokens (γ,) in
        the draft's ids, probs (γ, N) or None -> target ids (γ,), probs (γ, V) or None, c (γ,) or None."""
        conf = self._confidence(h, torch.cat([first.view(1), tokens[:-1]]))
        probs = self.spread(probs) if probs is not None else None
        return self.to_target(tokens), probs, (torch.sigmoid(conf) if conf is not None else None)
