"""A reduced-vocabulary DSpark draft written out as a whole-vocabulary one, for engines whose
DSpark has no draft-to-target id map (vLLM's and SGLang's DSpark read the lm_head over the
target's V tokens).

The expansion is exact on the draft's own N tokens and adds the others:
    lm_head   the target's whole lm_head (the reduced one is its rows of the N tokens)
    W2        its N rows at their target ids, zero rows elsewhere: no Markov bias off the vocabulary
    W1        row t = the reduced W1's row of t's draft id, or its shared "outside" row N
so for any context and previous tokens, the expanded logits at the N target ids equal the
reduced logits, and the other V - N tokens get the backbone's logit U alone, which the reduced
draft never proposed. Served that way, a draft may propose those tokens too: its acceptance is
close to the reduced draft's, not equal, and its head costs the whole vocabulary's products.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from splitserve.models.dspark import DSparkDraft

_REBUILT = ("lm_head.weight", "markov.w1.weight", "markov.w2.weight")


@torch.no_grad()
def expand_vocab(draft: DSparkDraft) -> DSparkDraft:
    """A reduced draft -> the whole-vocabulary draft above (a whole-vocabulary draft is returned as it is)."""
    a = draft.arch
    if not a.reduced:
        return draft
    weight = draft.lm_head.weight
    full = DSparkDraft(replace(a, draft_vocab_size=0)).to(device=weight.device, dtype=weight.dtype)
    kept = {k: v for k, v in draft.state_dict().items()
            if k in full.state_dict() and k not in _REBUILT}
    missing, unexpected = full.load_state_dict(kept, strict=False)
    if set(missing) - set(_REBUILT) or unexpected:
        raise RuntimeError(f"expanding the draft vocabulary left {missing} unset and {unexpected} unread")
    used = draft.vocab.used  # (N,)
    full.lm_head.weight.copy_(draft.target_lm_head.weight)  # (V, D)
    if draft.markov is not None:
        full.markov.w1.weight.copy_(draft.markov.w1.weight[draft.head_index])  # (V, r) from (N+1, r)
        full.markov.w2.weight.zero_()
        full.markov.w2.weight[used] = draft.markov.w2.weight  # (V, r) from (N, r)
    full.target_logit_transform = getattr(draft, "target_logit_transform", None)
    return full.train(draft.training)
