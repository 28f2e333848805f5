"""Reference speculative decoding, batch 1, plain PyTorch (gpt-fast style: readable first).

State between rounds, for committed tokens x_0 .. x_p (x_p = last target output, "anchor"):
    target KV cache     covers x_0 .. x_{p-1}
    drafter             the draft family's state (drafter.py): DSpark's context K/V covers the
                        target's captured hidden states at 0 .. p-1; EAGLE-3's own KV cache reads them
One round:
    1. draft:   d_1..d_γ (DSpark: from block [x_p, M, ..., M] at positions p .. p+γ-1; EAGLE-3: a chain)
    2. verify:  target forward on [x_p, d_1..d_γ] -> q_0..q_γ (one pass, γ+1 tokens)
    3. accept:  n tokens + 1 bonus (greedy or rejection sampling); τ_round = n + 1
    4. commit:  crop target cache to p+n+1, tell the drafter the captures at p..p+n and the
                tokens x_{p+1}..x_{p+n+1} that followed them
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import torch

from splitserve.errors import UserError
from splitserve.models.build import check_compatible
from splitserve.models.dspark import DSparkDraft
from splitserve.models.eagle3 import Eagle3Draft
from splitserve.speculative.drafter import reference_drafter
from splitserve.speculative.verify import race_draw, target_probs, verify_block
from splitserve.target.backend import DecodingTarget, require_decoding


@dataclass
class SpecResult:
    tokens: list[int]  # generated tokens (without the prompt), at most max_new_tokens
    accepts: list[int] = field(default_factory=list)  # per round: n accepted draft tokens
    # Per round, when asked for and the draft has a confidence head: c_1..c_γ (γ floats).
    confidences: list[list[float]] = field(default_factory=list)


def _stop_at(tokens: list[int], eos_ids: AbstractSet[int], limit: int) -> tuple[list[int], bool]:
    for i, tok in enumerate(tokens[:limit]):
        if tok in eos_ids:
            return tokens[: i + 1], True
    return tokens[:limit], len(tokens) >= limit


class SpecDecoder:
    def __init__(self, target: DecodingTarget, draft: DSparkDraft | Eagle3Draft):
        self.target, self.draft = require_decoding(target, "speculative decoding"), draft
        check_compatible(draft.arch, self.target.info, where="the draft")
        self.gamma = draft.arch.block_size

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        eos_ids: AbstractSet[int] | None = None,
        generator: torch.Generator | None = None,
        record_confidence: bool = False,
    ) -> SpecResult:
        """`record_confidence` keeps each round's confidences (one more host read per round);
        it never changes the tokens."""
        eos_ids = eos_ids or set()
        dev = self.target.device
        cache = self.target.new_cache()
        prompt = torch.tensor([prompt_ids], device=dev)
        logits, cap = self.target.forward_cached(prompt, cache, logits_from=prompt.shape[1] - 1)
        check_logits(logits[0, -1], self.target.dtype)
        anchor = pick_token(logits[0, -1], temperature, generator)
        drafter = reference_drafter(self.draft)  # this request's draft state
        drafter.commit(cap.aux, 0, torch.cat([prompt[0, 1:], anchor.view(1)]), len(prompt_ids) - 1)
        out, accepts, confidences = [int(anchor)], [], []
        p = len(prompt_ids)  # position of the anchor
        while True:
            out, done = _stop_at(out, eos_ids, max_new_tokens)
            if done:
                return SpecResult(out, accepts, confidences)
            d_tok, d_prob, conf = drafter.propose(anchor, p, temperature, generator)
            if record_confidence and conf is not None:
                confidences.append(conf.tolist())
            verify_in = torch.cat([anchor.view(1), d_tok])[None]  # (1, γ+1)
            logits, cap = self.target.forward_cached(verify_in, cache)
            n, bonus = verify_block(d_tok, d_prob, logits[0], temperature, generator)
            n_acc, bad = torch.stack([n, nonfinite(logits[0]).long()]).tolist()  # the one host read per round
            if bad:
                raise nonfinite_error(self.target.dtype, f"after {len(out)} generated tokens")
            self.target.crop_cache(cache, p + n_acc + 1)
            committed = torch.cat([d_tok[:n_acc], bonus.view(1)])  # (n+1,): x_{p+1} .. x_{p+n+1}
            drafter.commit(cap.aux[:, : n_acc + 1], p, committed, n_acc)
            out += committed.tolist()
            accepts.append(n_acc)
            anchor, p = bonus, p + n_acc + 1


def pick_token(logits: torch.Tensor, temperature: float, generator=None, top_k: int = 0,
               top_p: float = 1.0) -> torch.Tensor:
    """logits: (V,) -> () argmax at T=0, else a sample from q = truncate(softmax(logits / T),
    top_k, top_p): the same target distribution verification accepts against. The draw is the
    exponential race verification uses (argmax q / e, e ~ Exp(1), is distributed as q), not
    torch.multinomial: on CUDA that raises a device-side assert on a NaN, which ends the whole
    process, a server's other requests with it (`check_logits` names the usual cause)."""
    if temperature > 0:
        q = target_probs(logits, temperature, top_k, top_p)  # (V,)
        return race_draw(q, generator)
    return logits.argmax(-1)


class NonFiniteLogitsError(UserError):
    """The target's own logits hold a NaN or +inf: its activations overflow the dtype it runs in."""


def nonfinite(logits: torch.Tensor) -> torch.Tensor:
    """logits (..., V) of the target -> () bool on the device: some row holds a NaN, a +inf, or no
    finite value at all (-inf alone is a masked token, which is fine). A row's max keeps a NaN and
    is +inf or -inf exactly in the other two cases, so the rows' maxima decide it: two small
    launches, cheap enough for every decoding step."""
    return ~torch.isfinite(logits.amax(-1)).all()


def nonfinite_error(dtype: torch.dtype, where: str = "after the prompt") -> NonFiniteLogitsError:
    return NonFiniteLogitsError(
        f"the target's logits {where} are not finite (NaN or inf) with the target in {dtype}: "
        "its activations overflow that dtype (float16 does for some model families); load it in "
        "bfloat16 or float32 (--dtype)")


def check_logits(logits: torch.Tensor, dtype: torch.dtype) -> None:
    """logits (V,) of the target after a prompt -> None, or NonFiniteLogitsError in one line
    (a host read; the engine folds the flag into its read of the first token instead)."""
    if bool(nonfinite(logits)):
        raise nonfinite_error(dtype)


@torch.no_grad()
def target_decode(
    target: DecodingTarget,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_ids: AbstractSet[int] | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The target on its own, one token per forward with a KV cache: the exactness reference."""
    eos_ids = eos_ids or set()
    cache = require_decoding(target, "decoding with the target alone").new_cache()
    inp = torch.tensor([prompt_ids], device=target.device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits, _ = target.forward_cached(inp, cache, logits_from=inp.shape[1] - 1)
        tok = pick_token(logits[0, -1], temperature, generator)
        out.append(int(tok))
        if out[-1] in eos_ids:
            break
        inp = tok.view(1, 1)
    return out
