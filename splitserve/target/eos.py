"""The tokens that end a reply, one definition for evaluation, serving and benchmarks."""

from __future__ import annotations


def eos_ids(target) -> frozenset[int]:
    """The tokenizer's EOS and the generation config's (a list for some chat models). A target
    without a tokenizer works on bare ids and has no reply end: empty."""
    tok = target.tokenizer
    if tok is None:
        return frozenset()
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    gen_eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids |= {int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])}
    return frozenset(ids)
