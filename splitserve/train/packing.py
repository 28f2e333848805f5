"""Random anchors per sequence, packed densely into one block sequence with its exact mask.

For anchor position a (the last token the target produced), the block is
    inputs    [x_a, M, ..., M]          (γ positions, RoPE positions a .. a+γ-1)
    predicts  [x_{a+1}, ..., x_{a+γ}]   (position j predicts token a+j+1)
and may attend to target context positions t < a and to its own block (bidirectionally):
never to context at or after its anchor, never to another block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PackedBlocks:
    anchors: torch.Tensor  # (B, N) anchor positions
    anchor_valid: torch.Tensor  # (B, N) bool; padding anchors still attend to their own block
    block_ids: torch.Tensor  # (B, N*γ)
    block_pos: torch.Tensor  # (B, N*γ)
    mask: torch.Tensor  # (B, 1, N*γ, T + N*γ) bool, True = may attend
    label_pos: torch.Tensor  # (B, N, γ) position of the token each slot predicts (clamped to T-1)
    label_valid: torch.Tensor  # (B, N, γ) bool: this slot and all before it inside the sequence, on trained tokens


def sample_anchors(
    loss_mask: torch.Tensor,
    lengths: torch.Tensor,
    n: int,
    generator: torch.Generator | Sequence[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """loss_mask: (B, T) bool, lengths: (B,) -> anchors (B, N), valid (B, N).

    Candidates are positions a >= 1 (the draft always has some context, as after a prefill)
    where both the anchor x_a and its first prediction x_{a+1} are trained tokens. At inference
    the anchor is always a token the target produced (the previous round's bonus, or the first
    reply token that the prefill produced), never the last header token, so training does not
    spend anchors there either (the reference's candidate rule). Sampled without replacement; a
    sequence with fewer than n candidates gets padding anchors marked invalid. `generator` is
    one generator for all rows, or one per row.
    """
    b, t = loss_mask.shape
    pos = torch.arange(t)
    anchors = torch.zeros(b, n, dtype=torch.long)
    valid = torch.zeros(b, n, dtype=torch.bool)
    for i in range(b):
        cur = loss_mask[i].cpu().bool()
        nxt = torch.zeros(t, dtype=torch.bool)
        nxt[:-1] = cur[1:]
        cand = pos[(pos >= 1) & (pos + 1 < int(lengths[i])) & cur & nxt]
        if len(cand) == 0:
            continue
        g = generator if isinstance(generator, torch.Generator) else generator[i]
        pick = cand[torch.randperm(len(cand), generator=g)[:n]].sort().values
        anchors[i, : len(pick)] = pick
        valid[i, : len(pick)] = True
    return anchors, valid


def pack_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    lengths: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    context_window: int = 0,
) -> PackedBlocks:
    """input_ids, loss_mask: (B, T); anchors, anchor_valid: (B, N) -> PackedBlocks.
    context_window W > 0: a block anchored at a sees context a-W..a-1 only (as served)."""
    b, t = input_ids.shape
    n, g = anchors.shape[1], block_size
    dev = input_ids.device
    anchors, anchor_valid = anchors.to(dev), anchor_valid.to(dev)
    offs = torch.arange(g, device=dev)

    block_ids = torch.full((b, n, g), mask_token_id, dtype=input_ids.dtype, device=dev)
    block_ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
    block_pos = anchors[:, :, None] + offs  # (B, N, γ)

    label_pos = anchors[:, :, None] + offs + 1  # slot j predicts token a+j+1
    inside = label_pos < lengths.to(dev)[:, None, None]
    label_pos = label_pos.clamp(max=t - 1)
    on_loss = torch.gather(loss_mask, 1, label_pos.view(b, -1)).view(b, n, g).bool()
    # A slot is supervised only while every slot before it is: a round stops at its first
    # rejection, so no slot past an untrained label (a user turn inside the block, the end of
    # the sequence) can ever be reached through it. Cumulative product along the block.
    label_valid = torch.cumprod((inside & on_loss).to(torch.int32), dim=-1).bool() & anchor_valid[:, :, None]

    # Context part: query in block n sees context t < a_n.  (B, N, 1, T) -> (B, N*γ, T)
    ctx_pos = torch.arange(t, device=dev)[None, None, None, :]
    ctx_ok = ctx_pos < anchors[:, :, None, None]
    if context_window > 0:
        ctx_ok = ctx_ok & (ctx_pos >= anchors[:, :, None, None] - context_window)
    ctx_ok = ctx_ok.expand(b, n, g, t).reshape(b, n * g, t)
    # Block part: block-diagonal, bidirectional inside a block.  (N*γ, N*γ)
    blk = torch.arange(n, device=dev).repeat_interleave(g)
    blk_ok = (blk[:, None] == blk[None, :]).expand(b, n * g, n * g)
    mask = torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]  # (B, 1, N*γ, T + N*γ)

    return PackedBlocks(
        anchors=anchors,
        anchor_valid=anchor_valid,
        block_ids=block_ids.view(b, n * g),
        block_pos=block_pos.view(b, n * g),
        mask=mask,
        label_pos=label_pos,
        label_valid=label_valid,
    )
