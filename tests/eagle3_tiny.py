"""A tiny EAGLE-3 draft for export tests (tests/test_export_eagle3*.py), importable without the
speculators package."""

from __future__ import annotations

import torch
from tiny import VOCAB, tiny_target

from splitserve.config import DraftConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.vocab_map import VocabMap

T, N, STEPS = 14, 64, 3  # sequence length, draft vocabulary, training-time-test steps


def eagle3_draft(layer_ids=(1, 2, 4), layers: int = 1, vocab: int = N, seed: int = 0):
    """A tiny EAGLE-3 draft with every trained weight non-trivial and a draft vocabulary that is
    not the first N ids -> (target, draft)."""
    target = tiny_target(seed=1, layer_ids=layer_ids)
    torch.manual_seed(seed)
    cfg = DraftConfig(family="eagle3", num_layers=layers, intermediate_size=48, draft_vocab_size=vocab,
                      ttt_steps=STEPS)
    draft = build_draft(resolve_arch(cfg, target.info, target.model.config), target).eval()
    draft.set_vocab(VocabMap.from_ids(torch.randperm(VOCAB)[:vocab], VOCAB))
    for p in draft.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=0.1 if p.dim() == 1 else 0.0, std=0.3)
    return target, draft


def ascending(draft, aux: torch.Tensor) -> torch.Tensor:
    """aux (..., m*D) in the draft's layer order -> in ascending layer order, as engines capture."""
    d, ids = draft.arch.hidden_size, draft.arch.target_layer_ids
    return torch.cat([aux[..., i * d:(i + 1) * d] for i in sorted(range(len(ids)), key=ids.__getitem__)], -1)


def inputs(target, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (1, T) and the target's captured features (1, T, m*D) in its layer order."""
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(seed))
    return ids, target.capture(ids).aux
