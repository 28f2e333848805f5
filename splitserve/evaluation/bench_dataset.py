"""The random dataset of `splitserve bench --random`: prompts of exactly `input_len` token ids,
the ids a server would make of the prompt's text.

How the public benchmark clients build theirs (from their released source, sglang 0.5.23 and
vLLM 0.33.0), every request of `--random-range-ratio 1.0` at the full length:
- `vllm bench serve --dataset-name random`: consecutive non-special ids from a random offset,
  decoded to text and re-encoded, the ids cut or topped up with random ones and the round trip
  retried (10 times) until the length matches; the text is sent, and the server tokenizes it.
- `sglang.bench_serving --dataset-name random`: the first human turn of a ShareGPT conversation,
  its ids repeated and cut to the length, decoded to text; `--dataset-name random-ids`:
  consecutive ids, as vLLM's. Both leave room for the special tokens the server adds.

Here a prompt's body comes from `source`: "uniform" random non-special ids, "sequential" ids
(vLLM's random, sglang's random-ids), or a prompt set ("chitchat" or a chat JSONL) whose first
user turns are repeated to the length (sglang's random; ShareGPT itself is not bundled). The body
is decoded and re-encoded until it is its text's own tokenization, topped up with uniform ids
when the text re-encodes shorter; then the tokenizer's special tokens (BOS, ...) go around it as
a server adds them. Every prompt has exactly `input_len` ids; one whose text has not settled
after SETTLE_TRIES round trips keeps its ids and is counted (`unsettled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

UNIFORM, SEQUENTIAL = "uniform", "sequential"
SETTLE_TRIES = 10
CHUNK = 64  # prompts per batched decode / encode call


@dataclass
class RandomPrompts:
    ids: list[list[int]]  # (N, input_len) token ids, special tokens included
    texts: list[str]  # the bodies' text, what a client would send ("" without a tokenizer)
    source: str
    unsettled: int = 0  # prompts whose text does not re-encode to exactly their body
    special_tokens: list[int] = field(default_factory=list)  # added around each body, as a server does


def allowed_ids(vocab_size: int, avoid: set[int]) -> torch.Tensor:
    """Token ids a random prompt may hold: special tokens (and the draft's mask) change the mode."""
    return torch.tensor([i for i in range(vocab_size) if i not in avoid])


def synthetic_prompts(vocab_size: int, num: int, length: int, seed: int, avoid: set[int]) -> list[list[int]]:
    """Uniform random token ids, no tokenizer involved (the GPU scripts under bench/ use these)."""
    allowed = allowed_ids(vocab_size, avoid)
    g = torch.Generator().manual_seed(seed)
    return [allowed[torch.randint(len(allowed), (length,), generator=g)].tolist() for _ in range(num)]


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """-> (ids the tokenizer puts before a text, ids after), found by encoding a probe both ways."""
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a", add_special_tokens=True)
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return [], []


def _text_turns(source: str, seed: int) -> list[str]:
    """The first user turn of every prompt of a prompt set, shuffled by `seed`."""
    from splitserve.data import read_prompts, resolve_prompts_path
    from splitserve.errors import UserError

    turns = []
    for p in read_prompts(resolve_prompts_path(source)):
        if isinstance(p, str):
            turns.append(p)
        elif isinstance(p, list):  # token-id prompts have no text to repeat
            turns += [m["content"] for m in p if m["role"] == "user" and m.get("content")][:1]
    turns = [t for t in turns if t.strip()]
    if not turns:
        raise UserError(f"--random-source {source}: no prompt has a user turn with text")
    order = torch.randperm(len(turns), generator=torch.Generator().manual_seed(seed)).tolist()
    return [turns[i] for i in order]


def _bodies(source: str, num: int, length: int, allowed: torch.Tensor, g: torch.Generator, tokenizer,
            seed: int) -> list[list[int]]:
    if source == UNIFORM:
        return [allowed[torch.randint(len(allowed), (length,), generator=g)].tolist() for _ in range(num)]
    if source == SEQUENTIAL:
        offsets = torch.randint(len(allowed), (num,), generator=g).tolist()
        return [allowed[(off + i + torch.arange(length)) % len(allowed)].tolist() for i, off in enumerate(offsets)]
    if tokenizer is None:
        from splitserve.errors import UserError

        raise UserError(f"--random-source {source}: the target has no tokenizer to encode its text")
    turns = _text_turns(source, seed)
    out = []
    for i in range(num):
        ids = tokenizer.encode(turns[i % len(turns)], add_special_tokens=False) or [int(allowed[0])]
        out.append((ids * (length // len(ids) + 1))[:length])
    return out


def _settle(tokenizer, bodies: list[list[int]], allowed: torch.Tensor, g: torch.Generator) -> tuple[list[str], int]:
    """Make each body (in place) its own text's tokenization, same length -> (texts, unsettled)."""
    texts = [""] * len(bodies)
    todo = list(range(len(bodies)))
    for attempt in range(SETTLE_TRIES + 1):
        if not todo:
            break
        decoded = tokenizer.batch_decode([bodies[i] for i in todo], clean_up_tokenization_spaces=False)
        again = tokenizer(decoded, add_special_tokens=False)["input_ids"]
        left = []
        for i, text, ids in zip(todo, decoded, again):
            texts[i] = text
            if ids == bodies[i]:
                continue
            left.append(i)
            if attempt < SETTLE_TRIES:  # cut, or top up with uniform ids (the junction may merge: retried)
                n = len(bodies[i])
                extra = allowed[torch.randint(len(allowed), (max(0, n - len(ids)),), generator=g)].tolist()
                bodies[i] = (ids + extra)[:n]
        todo = left
    return texts, len(todo)


def random_prompts(tokenizer, vocab_size: int, num: int, input_len: int, seed: int, source: str = UNIFORM,
                   avoid: set[int] = frozenset()) -> RandomPrompts:
    """`num` prompts of exactly `input_len` ids, reproducible from `seed`. `tokenizer` None: the
    bodies as drawn (uniform or sequential only), no round trip."""
    from splitserve.errors import UserError

    if tokenizer is not None:
        vocab_size = min(vocab_size, tokenizer.vocab_size)  # ids the tokenizer can decode
        avoid = set(avoid) | set(getattr(tokenizer, "all_special_ids", None) or [])
    allowed = allowed_ids(vocab_size, set(avoid))
    before, after = special_tokens(tokenizer) if tokenizer is not None else ([], [])
    body_len = input_len - len(before) - len(after)
    if body_len < 1:
        raise UserError(f"--input-len {input_len}: the tokenizer adds {len(before) + len(after)} special tokens "
                        f"to every prompt, so it must be at least {len(before) + len(after) + 1}")
    g = torch.Generator().manual_seed(seed)
    bodies = _bodies(source, num, body_len, allowed, g, tokenizer, seed)
    if tokenizer is None:
        return RandomPrompts(bodies, [""] * num, source)
    texts, unsettled = [], 0
    for start in tqdm(range(0, num, CHUNK), desc="random prompts", unit="chunk", leave=False,
                      disable=num <= CHUNK):
        chunk = bodies[start : start + CHUNK]
        t, u = _settle(tokenizer, chunk, allowed, g)
        bodies[start : start + CHUNK] = chunk
        texts += t
        unsettled += u
    return RandomPrompts([before + b + after for b in bodies], texts, source, unsettled, before + after)
