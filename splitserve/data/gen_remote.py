"""`splitserve gen --endpoint URL ...`: regenerate a prompt set through serving engines.

The same replay as the in-process path (gen.py: every user turn answered in order, given the
target's own earlier replies), sent as `/v1/chat/completions` requests to one or more
OpenAI-compatible servers so that the server applies the target's chat template. Conversations
run concurrently: `concurrency` workers per endpoint each take the next (conversation, sample)
job and play its turns one request after another.

Nothing lost, nothing twice:
- a row is appended as one line, flushed, the moment its conversation completes; its id is the
  source row's id plus the sample index, and a rerun skips every id already in the file (a torn
  last line from a kill is cut off first, gen.read_done);
- a job whose request fails for good (after the pool's retries, or a 4xx refusal) is not
  written; it goes to `<out>.failures.jsonl` with its reason, is counted, and a rerun tries it
  again;
- sampling is seeded per request from (seed, row id, sample, turn), so which worker or endpoint
  served a request, and in which order, does not change what is asked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitserve.config import GenConfig, RemoteOptions  # noqa: F401  (RemoteOptions re-exported for callers)
from splitserve.data.endpoint import ChatReply, EndpointPool, RequestFailed
from splitserve.data.gen_plan import (
    FORMAT_VERSION,
    GenSummary,
    Source,
    read_done,
    read_sources,
    row_key,
)


@dataclass
class RemoteSummary(GenSummary):
    failed: Counter = field(default_factory=Counter)  # reason -> jobs
    retried: dict[str, int] = field(default_factory=dict)  # reason -> retried requests

    def format(self) -> str:
        s = self.settings
        mode = "greedy" if s.get("temperature", 0) == 0 else (
            f"T={s['temperature']} top_p={s['top_p']} top_k={s['top_k']} seed={s['seed']}")
        fails = ", ".join(f"{n} {r}" for r, n in self.failed.most_common()) or "none"
        retries = ", ".join(f"{n} {r}" for r, n in sorted(self.retried.items())) or "none"
        secs = max(self.seconds, 1e-9)
        return "\n".join([
            f"splitserve gen -> {self.out}",
            f"  target   {s.get('target')} via {len(s.get('endpoints', []))} endpoint(s), {mode}, "
            f"<= {s.get('max_new_tokens')} new tokens per reply",
            f"  rows     {self.written} written ({self.written / secs:.2f} rows/s), {self.already_done} already there "
            f"(skipped), {self.no_user_turn} without a user turn, {self.too_long} with a first prompt >= max_length",
            f"  failed   {fails} (in {self.out}.failures.jsonl; a rerun retries them)",
            f"  retried  {retries}",
            f"  replies  {self.turns} ({self.unfinished} cut at max_new_tokens), {self.new_tokens:,} tokens in "
            f"{self.seconds:.1f} s ({self.new_tokens / secs:.1f} tok/s)",
        ])


def request_seed(seed: int, row_id: str, sample: int, turn: int) -> int:
    digest = hashlib.sha1(f"{seed}:{row_id}:{sample}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _body(cfg: GenConfig, opts: RemoteOptions, model: str, messages: list[dict], seed: int) -> dict[str, Any]:
    # Only what differs from a server's defaults is sent, so a server that refuses an option it
    # does not implement (top_p on a lossless speculative server) still serves the defaults.
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": cfg.max_new_tokens,
                            "temperature": cfg.temperature}
    if cfg.temperature > 0:
        body["seed"] = seed
        if cfg.top_p < 1:
            body["top_p"] = cfg.top_p
        if cfg.top_k > 0:
            body["top_k"] = cfg.top_k
    if opts.template_kwargs(cfg):
        body["chat_template_kwargs"] = opts.template_kwargs(cfg)
    return body


class _TooLong(Exception):
    """The first prompt of a conversation is max_length tokens or more (the server counted)."""


async def _play(pool: EndpointPool, slot: int, cfg: GenConfig, opts: RemoteOptions, model: str,
                source: Source, sample: int) -> tuple[list[dict], list[ChatReply]]:
    """One conversation's turns, in order: -> (messages with the new replies, replies)."""
    limit = len(source.turns) if cfg.max_turns is None else min(cfg.max_turns, len(source.turns))
    messages: list[dict] = []
    replies: list[ChatReply] = []
    for r in range(limit):
        asked = messages + source.turns[r]
        seed = request_seed(cfg.seed, source.row_id, sample, r)
        reply = await pool.chat(_body(cfg, opts, model, asked, seed), slot)
        if reply.prompt_tokens is not None and reply.prompt_tokens >= cfg.max_length:
            if r == 0:
                raise _TooLong
            break  # as in-process: no reply to a prompt that no training sequence could hold
        answer: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if opts.reasoning == "keep" and reply.reasoning:
            answer["reasoning_content"] = reply.reasoning
        messages = asked + [answer]
        replies.append(reply)
    return messages, replies


def new_tokens(reply: ChatReply) -> int:
    """Generated tokens, the end-of-turn token excluded as in-process (servers count it in usage)."""
    n = reply.completion_tokens or 0
    return max(0, n - 1) if reply.finish_reason == "stop" else n


def _row(source: Source, sample: int, messages: list[dict], replies: list[ChatReply],
         settings: dict[str, Any]) -> dict[str, Any]:
    gen = {
        "version": FORMAT_VERSION, "source_row": source.row_id, "source_line": source.line, "sample": sample,
        **settings, "turns": len(replies), "new_tokens": sum(map(new_tokens, replies)),
        "unfinished_turns": sum(r.finish_reason == "length" for r in replies),
    }
    return {"messages": messages, "gen": gen}


def remote_settings(cfg: GenConfig, opts: RemoteOptions, model: str) -> dict[str, Any]:
    """Everything that decides a row's content (a resumed run must match), and the endpoints."""
    keys = ("data", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "max_turns", "max_length")
    return {"target": model, **{k: getattr(cfg, k) for k in keys},
            "chat_template_kwargs": opts.template_kwargs(cfg), "reasoning": opts.reasoning}


async def _run(cfg: GenConfig, opts: RemoteOptions, progress: bool) -> RemoteSummary:
    from tqdm import tqdm

    from splitserve.data import resolve_train_path

    t0 = time.time()
    summary = RemoteSummary(out=cfg.out)
    sources = read_sources(resolve_train_path(cfg.data), cfg.max_rows)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    async with EndpointPool(opts.endpoint, seed=cfg.seed) as pool:
        model = await pool.model_id()
        settings = remote_settings(cfg, opts, model)
        summary.settings = {**settings, "endpoints": pool.roots}
        done = read_done(out, settings)
        jobs: asyncio.Queue[tuple[Source, int]] = asyncio.Queue()
        for s in sources:
            if not s.turns:
                summary.no_user_turn += 1
                continue
            for k in range(opts.num_samples):
                if row_key(s.row_id, k) in done:
                    summary.already_done += 1
                else:
                    jobs.put_nowait((s, k))
        bar = tqdm(total=jobs.qsize(), unit="row", desc="gen", disable=not progress)
        with open(out, "a", encoding="utf-8") as f, open(f"{out}.failures.jsonl", "a", encoding="utf-8") as fail:

            async def worker(slot: int) -> None:
                while not jobs.empty():
                    source, sample = jobs.get_nowait()
                    try:
                        messages, replies = await _play(pool, slot, cfg, opts, model, source, sample)
                    except _TooLong:
                        summary.too_long += 1
                    except RequestFailed as e:
                        summary.failed[e.reason] += 1
                        fail.write(json.dumps({"source_row": source.row_id, "sample": sample, "reason": e.reason,
                                               "detail": e.detail, "time": time.time()}) + "\n")
                        fail.flush()
                    else:
                        # One write of one whole line: a kill leaves at most a torn last line,
                        # which the next run cuts off.
                        f.write(json.dumps(_row(source, sample, messages, replies, settings), ensure_ascii=False)
                                + "\n")
                        f.flush()
                        summary.written += 1
                        summary.turns += len(replies)
                        summary.new_tokens += sum(map(new_tokens, replies))
                        summary.unfinished += sum(r.finish_reason == "length" for r in replies)
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{summary.new_tokens / max(time.time() - t0, 1e-9):.1f}",
                                    failed=sum(summary.failed.values()), refresh=False)

            await asyncio.gather(*(worker(i) for i in range(opts.endpoint.concurrency * len(pool.roots))))
        bar.close()
        summary.retried = dict(pool.retried)
    summary.seconds = time.time() - t0
    return summary


def run_gen_remote(cfg: GenConfig, opts: RemoteOptions, progress: bool = True) -> RemoteSummary:
    cfg.check()
    opts.check(cfg)
    return asyncio.run(_run(cfg, opts, progress))
