"""`splitserve gen`: regenerate the assistant turns of a prompt set with the target itself.

A draft is verified against the target, so the text it should learn to predict is the target's
own output, not what a person or another model wrote. `gen` keeps the prompt side of every
conversation and replaces its assistant turns with the target's replies.

Which turns: all of them, in order. The conversation is replayed: each user turn (with any
system messages before it) is kept, every original assistant turn is dropped, and the target
answers each user turn given the conversation so far, its own earlier replies included.
Training masks every assistant turn, so keeping a human-written earlier reply would train on it
too, and at serving time the target conditions on its own replies. A conversation that ends on
an unanswered user turn gets a reply as well (about half of chitchat is one unanswered
message). Later user turns were written in answer to the original replies and can read oddly
after the first exchange; `max_turns=1` keeps only the first one. An assistant turn with no
user turn before it is dropped, its system messages carried into the next prompt.

Batching: `continuous` (the default, gen_continuous.py) keeps up to batch_size conversations in
flight in transformers' continuous-batching manager and writes each row when its conversation
ends; `static` (here) runs fixed slices of the input one turn at a time. The endpoint path,
which sends the turns to OpenAI-compatible servers instead, is gen_remote.py.

Resuming: every input row has a stable id (its "id" field, else a hash of its messages; "#n"
marks repeats). Output rows are appended and flushed as they are written; a rerun checks that
the rows already there were made with the same settings, drops a torn last line, and skips their
ids. Static batches are fixed slices of the input and a sampled batch is seeded with seed + its
index, so with the same batch size a resumed static run writes the same file as one that never
stopped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from splitserve.data.chat import Message
from splitserve.data.gen_continuous import generation_config, regenerate_continuous, to_reply
from splitserve.data.gen_plan import (  # noqa: F401  (the reading side, re-exported for callers)
    FORMAT_VERSION,
    GenConfig,
    GenSummary,
    Reply,
    Source,
    gen_chat,
    plan_turns,
    read_done,
    read_sources,
    row_key,
)
from splitserve.data.prompts import encode_prompt
from splitserve.target.eos import reply_end_ids

# --------------------------------------------------------------------------- generating


def load_generator(cfg: GenConfig) -> tuple[Any, Any, frozenset[int]]:
    """The target as a plain causal LM (no captured layers needed): model, tokenizer, stop ids."""
    from splitserve.assets import resolve_target_path
    from splitserve.target.hf import DTYPES, load_causal_lm, load_tokenizer, pick_device

    if cfg.dtype not in DTYPES:
        from splitserve.errors import UserError

        raise UserError(f"--dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    path = resolve_target_path(cfg.target)
    model = load_causal_lm(path, DTYPES[cfg.dtype], pick_device(cfg.device))
    return prepare_model(model, load_tokenizer(path))


def prepare_model(model: Any, tokenizer: Any) -> tuple[Any, Any, frozenset[int]]:
    """-> (model, tokenizer, stop ids), the model's own generation defaults cleared."""
    from transformers import GenerationConfig

    stop = stop_ids(model, tokenizer)
    # The draft is verified against the target's plain distribution, so the checkpoint's
    # suggested decoding settings (repetition penalty, its own top_p, ...) must not apply.
    model.generation_config = GenerationConfig(bos_token_id=model.generation_config.bos_token_id)
    return model.eval(), tokenizer, stop


def stop_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-turn ids (target/eos.py); generation cannot end replies without one."""
    ids = reply_end_ids(model, tokenizer)
    if not ids:
        raise ValueError("the target has no end-of-turn token (tokenizer.eos_token_id); cannot end replies")
    return ids


@torch.no_grad()
def generate_replies(
    model: Any, tokenizer: Any, prompts: list[list[int]], cfg: GenConfig, stop: set[int]
) -> list[Reply]:
    """One reply per prompt, the batch left-padded into a single `generate` call."""
    gc = generation_config(cfg, tokenizer, stop)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), gc.pad_token_id, dtype=torch.long)  # (B, T) left-padded
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    dev = next(model.parameters()).device
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc)
    # (B, new) generated ids, padded after a stop
    return [to_reply(tokenizer, row, stop) for row in out[:, width:].tolist()]


def regenerate(
    model: Any, tokenizer: Any, sources: list[Source], cfg: GenConfig, stop: set[int]
) -> list[tuple[list[Message], list[Reply]]]:
    """Replay a batch of conversations turn by turn; -> (messages, replies) per source."""
    limit = cfg.max_turns if cfg.max_turns is not None else max(len(s.turns) for s in sources)
    messages: list[list[Message]] = [[] for _ in sources]
    replies: list[list[Reply]] = [[] for _ in sources]
    active = list(range(len(sources)))
    chat = gen_chat(cfg)
    for r in range(limit):
        going, prompts = [], []
        for i in active:
            if r >= len(sources[i].turns):
                continue
            ids = encode_prompt(tokenizer, messages[i] + sources[i].turns[r], chat)
            if len(ids) >= cfg.max_length:
                continue  # nothing of this reply would fit in a training sequence
            going.append(i)
            prompts.append(ids)
        if not going:
            break
        for i, reply in zip(going, generate_replies(model, tokenizer, prompts, cfg, stop)):
            messages[i] += sources[i].turns[r] + [{"role": "assistant", "content": reply.text}]
            replies[i].append(reply)
        active = going
    return list(zip(messages, replies))


def _row(source: Source, messages: list[Message], replies: list[Reply], settings: dict[str, Any]) -> dict:
    gen = {
        "version": FORMAT_VERSION, "source_row": source.row_id, "source_line": source.line, **settings,
        "turns": len(replies), "new_tokens": sum(len(r.token_ids) for r in replies),
        "unfinished_turns": sum(not r.finished for r in replies),
    }
    return {"messages": messages, "gen": gen}


def run_gen(cfg: GenConfig, loaded: tuple[Any, Any, frozenset[int]] | None = None, progress: bool = True) -> GenSummary:
    """Read, plan, skip what `cfg.out` already has, generate batch by batch, append."""
    from tqdm import tqdm

    from splitserve.data import resolve_train_path

    cfg.check()
    t0 = time.time()
    settings = cfg.settings()
    summary = GenSummary(out=cfg.out, settings=settings)
    sources = read_sources(resolve_train_path(cfg.data), cfg.max_rows)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = read_done(out, settings)
    model, tokenizer, stop = loaded or load_generator(cfg)

    planned = []
    chat = gen_chat(cfg)
    for s in sources:
        if not s.turns:
            summary.no_user_turn += 1
        elif len(encode_prompt(tokenizer, s.turns[0], chat)) >= cfg.max_length:
            summary.too_long += 1
        else:
            planned.append(s)
    summary.already_done = sum(s.row_id in done for s in planned)
    bar = tqdm(total=len(planned) - summary.already_done, unit="row", desc="gen", disable=not progress)
    with open(out, "a", encoding="utf-8") as f:

        def write(rows: list[tuple[Source, list[Message], list[Reply]]]) -> None:
            # Whole lines in one write, flushed: a stop leaves at most a torn last line.
            f.write("".join(json.dumps(_row(s, m, r, settings), ensure_ascii=False) + "\n" for s, m, r in rows))
            f.flush()
            for _s, _m, replies in rows:
                summary.turns += len(replies)
                summary.new_tokens += sum(len(r.token_ids) for r in replies)
                summary.unfinished += sum(not r.finished for r in replies)
            summary.written += len(rows)
            bar.update(len(rows))
            bar.set_postfix(tok_s=f"{summary.new_tokens / max(time.time() - t0, 1e-9):.1f}", refresh=False)

        todo = [s for s in planned if s.row_id not in done]
        if cfg.batching == "continuous" and todo:
            regenerate_continuous(model, tokenizer, todo, cfg, stop, lambda s, m, r: write([(s, m, r)]))
        elif todo:
            for k in range(0, len(planned), cfg.batch_size):
                chunk = [s for s in planned[k:k + cfg.batch_size] if s.row_id not in done]
                if not chunk:
                    continue
                if cfg.temperature > 0:
                    torch.manual_seed(cfg.seed + k // cfg.batch_size)
                write([(s, m, r) for s, (m, r) in zip(chunk, regenerate(model, tokenizer, chunk, cfg, stop))])
    bar.close()
    summary.seconds = time.time() - t0
    return summary
