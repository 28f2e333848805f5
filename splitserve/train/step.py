"""One training forward: records -> packed blocks -> draft -> loss.

The lm_head runs on the draft side at the sampled positions only: never full-vocab logits over
a whole sequence, and nothing wider than D per token crosses from the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from splitserve.config import LossConfig, decay_for
from splitserve.models.dspark import DSparkDraft
from splitserve.records import HiddenRecord
from splitserve.target.sdpa import varlen_sdpa
from splitserve.train.losses import LossInputs, LossOut, RowTerms, compute_loss, decay_weights, row_terms
from splitserve.train.packing import PackedBlocks, pack_blocks, sample_anchors


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T), right-padded
    loss_mask: torch.Tensor  # (B, T) bool
    lengths: torch.Tensor  # (B,)
    aux: torch.Tensor  # (B, T, m*D)
    final: torch.Tensor  # (B, T, D)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


def collate(records: list[HiddenRecord], device: torch.device, dtype: torch.dtype) -> Batch:
    """Right-pad a list of records into one batch on `device`.

    The batch is assembled where the records are when they all share a device (records that
    came over NCCL are already on the GPU: no round trip through host memory), else on the host.
    """
    b, t = len(records), max(r.num_tokens for r in records)
    aux_dim, d = records[0].aux.shape[-1], records[0].final.shape[-1]
    home = records[0].aux.device
    if any(r.aux.device != home for r in records):
        home = torch.device("cpu")
    ids = torch.zeros(b, t, dtype=torch.long, device=home)  # (B, T)
    mask = torch.zeros(b, t, dtype=torch.bool, device=home)  # (B, T)
    aux = torch.zeros(b, t, aux_dim, dtype=dtype, device=home)  # (B, T, m*D)
    final = torch.zeros(b, t, d, dtype=dtype, device=home)  # (B, T, D)
    for i, r in enumerate(records):
        n = r.num_tokens
        ids[i, :n], mask[i, :n] = r.input_ids, r.loss_mask
        aux[i, :n], final[i, :n] = r.aux.to(dtype), r.final.to(dtype)
    lengths = torch.tensor([r.num_tokens for r in records])
    return Batch(ids.to(device), mask.to(device), lengths.to(device), aux.to(device), final.to(device))


def row_generators(seed: int, step: int, rows: range) -> list[torch.Generator]:
    """One anchor generator per row of the *global* batch, so that a row's anchors do not depend
    on which rank or micro-batch trains it (split training equals single-process training)."""
    return [torch.Generator().manual_seed((seed * 1_000_003 + step) * 65_537 + r) for r in rows]


def plan_blocks(
    draft: DSparkDraft,
    batch: Batch,
    anchors_per_seq: int,
    generator: torch.Generator | Sequence[torch.Generator],
) -> PackedBlocks:
    """Sample anchors and pack their blocks; depends on the data only, not on the weights."""
    arch = draft.arch
    anchors, valid = sample_anchors(batch.loss_mask.cpu(), batch.lengths.cpu(), anchors_per_seq, generator)
    return pack_blocks(
        batch.input_ids, batch.loss_mask, batch.lengths, anchors, valid, arch.block_size, arch.mask_token_id,
        arch.context_window,
    )


def position_weight(packed: PackedBlocks, loss_cfg: LossConfig) -> torch.Tensor:
    """Total position weight of a planned batch: the denominator the paper loss divides by.

    Data-parallel ranks and gradient-accumulation micro-batches scale their loss by
    (own weight / global weight), which makes the summed gradient equal to the single-process
    gradient of the whole batch exactly for decay-normalised losses, and a position-weighted
    average for the others.
    """
    slot = packed.label_valid.nonzero(as_tuple=True)[2]
    return decay_weights(slot, decay_for(loss_cfg, packed.label_valid.shape[-1])).sum()


def _target_logits(draft: DSparkDraft, final: torch.Tensor) -> torch.Tensor:
    """final: (P, D) the target's final hidden states -> (P, V) its logits, as its own forward
    makes them (soft-cap / scaling included). No gradient."""
    with torch.no_grad():
        logits = draft.target_head(final)
        transform = getattr(draft, "target_logit_transform", None)  # the target's soft-cap / scaling
        return transform(logits) if transform is not None else logits


def _chunk_terms(draft: DSparkDraft, h: torch.Tensor, z: torch.Tensor | None, final: torch.Tensor,
                 labels: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, ...]:
    """One chunk of rows, h (n, D), z (n, r) or None, final (n, D), labels (n,) -> its row terms
    (ce, tv[, mass]), each (n,)."""
    t = row_terms(draft.head_logits(h, z), _target_logits(draft, final.to(h.dtype)), labels, greedy, draft.vocab)
    return (t.ce, t.tv, t.mass) if greedy else (t.ce, t.tv)


def chunked_row_terms(draft: DSparkDraft, h: torch.Tensor, z: torch.Tensor | None, final: torch.Tensor,
                      labels: torch.Tensor, greedy: bool, chunk_rows: int) -> RowTerms:
    """The row terms of P rows (h (P, D), z (P, r) or None, final (P, D), labels (P,)), chunk_rows
    rows at a time, each chunk under activation checkpointing: its (n, V) logits and
    probabilities are freed after its forward and recomputed in the backward, so the loss holds
    one chunk's vocabulary-wide tensors at a time instead of all P rows' (one more lm_head
    product per chunk in the backward). Rows are independent, so the terms are the unchunked
    ones up to the products' rounding at another row count."""
    parts = []
    for s in range(0, labels.numel(), chunk_rows):
        rows = slice(s, s + chunk_rows)
        parts.append(checkpoint(_chunk_terms, draft, h[rows], None if z is None else z[rows], final[rows],
                                labels[rows], greedy, use_reentrant=False))
    cols = [torch.cat(c) for c in zip(*parts)]
    return RowTerms(cols[0], cols[1], cols[2] if greedy else None)


def draft_loss(
    draft: DSparkDraft,
    batch: Batch,
    anchors_per_seq: int,
    loss_cfg: LossConfig,
    generator: torch.Generator | Sequence[torch.Generator],
    packed: PackedBlocks | None = None,
    chunk_rows: int = 0,
) -> tuple[LossOut, int]:
    """Returns the loss and the number of trained block positions. `packed` (from plan_blocks)
    skips the planning; `generator` is then unused. `chunk_rows` > 0 computes the vocabulary-wide
    part of the loss that many rows at a time (chunked_row_terms); 0: all rows at once."""
    arch = draft.arch
    b, t = batch.input_ids.shape
    if packed is None:
        packed = plan_blocks(draft, batch, anchors_per_seq, generator)
    ctx_pos = torch.arange(t, device=batch.input_ids.device).expand(b, t)
    ctx_kv = draft.context_kv(batch.aux, ctx_pos)
    with varlen_sdpa():  # the context length changes every step (target/sdpa.py)
        h = draft.backbone(packed.block_ids, packed.block_pos, ctx_kv, packed.mask)  # (B, N*γ, D)
    h = h.view(b, -1, arch.block_size, h.shape[-1])  # (B, N, γ, D)

    # Teacher forcing: each block's previous tokens are [x0, x*_1 .. x*_{γ-1}].  (B, N, γ)
    prev_grid = batch.input_ids[torch.arange(b, device=h.device)[:, None, None], packed.label_pos - 1]
    z = draft.markov_latent(h, prev_grid)  # (B, N, γ, r) or None: whole blocks (the rnn head runs along them)

    sel = packed.label_valid.nonzero(as_tuple=True)  # P positions
    bi, slot = sel[0], sel[2]
    block = bi * packed.label_valid.shape[1] + sel[1]  # (P,) one id per (sequence, anchor)
    label_pos = packed.label_pos[sel]  # (P,)
    labels = batch.input_ids[bi, label_pos]
    prev = prev_grid[sel]  # (P,)
    h_sel = h[sel]  # (P, D)
    z_sel = z[sel] if z is not None else None  # (P, r)
    # Target's distribution for token a+k comes from its final hidden state at a+k-1.
    final = batch.final[bi, label_pos - 1]  # (P, D)
    draft_logits = target_logits = rows = None
    if chunk_rows > 0 and labels.numel():
        rows = chunked_row_terms(draft, h_sel, z_sel, final, labels, loss_cfg.acceptance == "greedy", chunk_rows)
    else:
        draft_logits = draft.head_logits(h_sel, z_sel)  # (P, N)
        target_logits = _target_logits(draft, final.to(h_sel.dtype))  # (P, V)
    inputs = LossInputs(
        draft_logits=draft_logits,
        target_logits=target_logits,
        rows=rows,
        labels=labels,
        slot=slot,
        conf_logits=draft.confidence_logit(h_sel, prev),
        block_size=arch.block_size,
        block=block,
        vocab=draft.vocab,
    )
    return compute_loss(inputs, loss_cfg), int(labels.numel())
