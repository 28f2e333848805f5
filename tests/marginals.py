"""The T=1 losslessness check the engine tests share: the exact distributions of the two tokens
after a context, and the same two tokens sampled by the engine's speculative rounds.

One prefill, then every sample rewinds the committed length and the anchor (and, through
`rewind`, whatever state a draft family keeps between rounds) and runs rounds until it has two
tokens: what generate() does after its prefill, without paying for the prefill each time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def two_token_marginals(target, ctx: list[int], transform: Callable | None = None,
                        trunc: tuple[int, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact P(x1) and P(x2) after ctx, each (V,): from the model's logits put through `transform`
    (None: as they are), and truncated to top-k / top-p by `trunc` (None: untruncated)."""
    from splitserve.speculative.verify import truncate_probs

    n = target.info.vocab_size

    def probs(logits: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(transform(logits) if transform is not None else logits, -1)
        return truncate_probs(p, *trunc) if trunc is not None else p

    with torch.no_grad():
        p1 = probs(target.model(torch.tensor([ctx])).logits[0, -1])  # (V,)
        nxt = torch.cat([torch.tensor([ctx]).expand(n, len(ctx)), torch.arange(n)[:, None]], 1)
        p2 = p1 @ probs(target.model(nxt).logits[:, -1])
    return p1, p2


def sample_two_tokens(engine, committed: int, anchor: int, n: int, trunc: tuple[int, float] = (0, 1.0),
                      rewind: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """T=1 rounds of a prefilled engine, each sample from `committed` tokens and `anchor` ->
    counts (V,) of the first and of the second token, and every round's accepted count."""
    vocab = engine.target.info.vocab_size
    first, second, accepted = torch.zeros(vocab), torch.zeros(vocab), []
    for _ in range(n):
        engine.seq_len.fill_(committed)
        engine.anchor.fill_(anchor)
        if rewind is not None:
            rewind()
        toks = []
        while len(toks) < 2:
            engine._spec_round(1.0, engine.windows[-1], trunc)
            out = engine.out.tolist()
            toks += out[1: out[0] + 2]
            accepted.append(out[0])
        first[toks[0]] += 1
        second[toks[1]] += 1
    return first, second, accepted
