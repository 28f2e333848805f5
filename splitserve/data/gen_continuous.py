"""In-process `gen` with continuous batching: a finished reply frees its place at once.

The static path (gen.regenerate) runs a batch of conversations one turn at a time: every
`generate` call lasts as long as the batch's longest reply, and the batch's next turn waits for
all of them. Here transformers' continuous-batching manager (a paged KV cache and a scheduler
over a request queue, run in a background thread) does the batching, and this module only feeds
it turns: up to `batch_size` conversations are in flight; when a reply comes back, the same
conversation's next turn is queued, and when a conversation ends, the next one starts. Rows are
handed to `on_row` the moment their conversation ends, so the caller writes them as they come.

On a CPU the paged cache is sized to what the run can use (batch_size conversations of at most
max_length + max_new_tokens tokens): left to itself, transformers sizes it from free device memory,
which on a CPU is most of the machine's RAM. On a GPU its own sizing (a share of free memory) stays.

Greedy rows equal the static path's (same prompts, same plain distribution; tested). Sampled
rows are seeded once per run, not per row: which rows share a step depends on timing, so a
sampled run is not reproducible row by row (`--batching static` is).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from splitserve.data.chat import ChatTemplate, Message
from splitserve.data.gen_plan import GenConfig, Reply, Source, gen_chat
from splitserve.data.prompts import encode_prompt

OnRow = Callable[[Source, list[Message], list[Reply]], None]


def generation_config(cfg: GenConfig, tokenizer: Any, stop: set[int]):
    """The target's plain distribution (greedy, or cfg's sampling), stopping at `stop`. Every
    field that could select a logits processor is set, so nothing else applies. Both in-process
    paths generate with it."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    sampling = cfg.temperature > 0
    return GenerationConfig(
        max_new_tokens=cfg.max_new_tokens, do_sample=sampling, num_beams=1,
        temperature=cfg.temperature if sampling else None, top_p=cfg.top_p if sampling else None,
        top_k=cfg.top_k if sampling else None, eos_token_id=sorted(stop), pad_token_id=pad,
    )


def to_reply(tokenizer: Any, ids: list[int], stop: set[int]) -> Reply:
    """Generated ids -> Reply, cut before the first end-of-turn id (and whatever padding follows)."""
    end = next((j for j, t in enumerate(ids) if t in stop), None)
    toks = ids if end is None else ids[:end]
    return Reply(toks, tokenizer.decode(toks, skip_special_tokens=True), finished=end is not None)


def cache_config(cfg: GenConfig, device: torch.device, page_size: int = 256):
    """A paged cache that holds every conversation in flight at its longest, on a CPU; None on a
    GPU (transformers then takes a share of the free memory)."""
    if torch.device(device).type != "cpu":
        return None
    from transformers import ContinuousBatchingConfig

    longest = cfg.max_length + cfg.max_new_tokens
    blocks = cfg.batch_size * -(-longest // page_size)
    return ContinuousBatchingConfig(page_size=page_size, num_blocks=blocks,
                                    max_batch_tokens=min(8192, cfg.batch_size * longest))


class _Conversation:
    def __init__(self, source: Source, limit: int):
        self.source = source
        self.limit = min(limit, len(source.turns))
        self.messages: list[Message] = []
        self.replies: list[Reply] = []

    def next_prompt(self, tokenizer: Any, max_length: int, chat: ChatTemplate) -> list[int] | None:
        """The next turn's prompt ids, or None when the conversation is over."""
        r = len(self.replies)
        if r >= self.limit:
            return None
        ids = encode_prompt(tokenizer, self.messages + self.source.turns[r], chat)
        return ids if len(ids) < max_length else None  # as the static path: nothing would fit

    def add(self, reply: Reply) -> None:
        r = len(self.replies)
        self.messages += self.source.turns[r] + [{"role": "assistant", "content": reply.text}]
        self.replies.append(reply)


@torch.no_grad()
def regenerate_continuous(model: Any, tokenizer: Any, sources: list[Source], cfg: GenConfig, stop: set[int],
                          on_row: OnRow, poll_s: float = 1.0) -> None:
    """Play every source's turns through one continuous-batching manager; `on_row` per conversation."""
    if cfg.temperature > 0:
        torch.manual_seed(cfg.seed)
    manager = model.init_continuous_batching(generation_config=generation_config(cfg, tokenizer, stop),
                                             continuous_batching_config=cache_config(cfg, model.device))
    manager.start()
    limit = cfg.max_turns if cfg.max_turns is not None else max((len(s.turns) for s in sources), default=0)
    waiting = iter(range(len(sources)))
    live: dict[int, _Conversation] = {}
    ask_n = 0
    chat = gen_chat(cfg)

    def ask(i: int, conv: _Conversation) -> bool:
        nonlocal ask_n
        ids = conv.next_prompt(tokenizer, cfg.max_length, chat)
        if ids is None:
            return False
        manager.add_request(ids, request_id=f"{i}:{len(conv.replies)}:{ask_n}", max_new_tokens=cfg.max_new_tokens,
                            eos_token_id=sorted(stop))
        ask_n += 1
        return True

    def start_next() -> None:
        for i in waiting:  # resumes where the last call stopped
            conv = _Conversation(sources[i], limit)
            if ask(i, conv):
                live[i] = conv
                return
            on_row(conv.source, conv.messages, conv.replies)  # nothing to ask (the caller filters these)

    try:
        for _ in range(cfg.batch_size):
            start_next()
        while live:
            res = manager.get_result(timeout=poll_s)
            if res is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous-batching thread stopped with requests in flight")
                continue
            if not res.is_finished():
                continue
            if res.error:
                raise RuntimeError(f"continuous batching failed on request {res.request_id}: {res.error}")
            i = int(res.request_id.split(":")[0])
            conv = live[i]
            conv.add(to_reply(tokenizer, list(res.generated_tokens), stop))
            if not ask(i, conv):
                del live[i]
                on_row(conv.source, conv.messages, conv.replies)
                start_next()
    finally:
        manager.stop(block=True)
