"""The tokens that end a reply, one definition for generation, evaluation, serving and benchmarks."""

from __future__ import annotations

from typing import Any


def reply_end_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's EOS and the model's generation-config EOS (one id or a list: some chat
    models stop on several)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids |= {int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])}
    return frozenset(ids)


def eos_ids(target) -> frozenset[int]:
    """reply_end_ids of a loaded transformers target (its `model` and `tokenizer`; callers ask
    the target: `DecodingTarget.eos_ids()`). A target without a tokenizer works on bare ids and
    has no reply end: empty."""
    if target.tokenizer is None:
        return frozenset()
    return reply_end_ids(target.model, target.tokenizer)
