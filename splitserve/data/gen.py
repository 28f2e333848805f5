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

Resuming: every input row has a stable id (its "id" field, else a hash of its messages; "#n"
marks repeats). Output rows are appended and flushed once per batch; a rerun checks that the
rows already there were made with the same settings, drops a torn last line, and skips their
ids. Batches are fixed slices of the input and a sampled batch is seeded with seed + its index,
so with the same batch size a run resumed after a stop writes the same file as one that never
stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from splitserve.data.chat import Message, parse_messages
from splitserve.data.prompts import encode_prompt
from splitserve.data.rows import DataError, iter_json_rows, iter_rows
from splitserve.target.eos import reply_end_ids

FORMAT_VERSION = 1


@dataclass
class GenConfig:
    """What `splitserve gen` does; the fields in `settings()` are recorded in every row."""

    data: str = "chitchat"  # "chitchat" (the embedded default) or a chat JSONL path
    out: str = "gen.jsonl"
    target: str = "smollm2-135m"  # the embedded default or a HF model directory
    target_name: str | None = None  # default: "smollm2-135m" or the directory's name
    max_new_tokens: int = 256  # per reply
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # sampling only; 1: off
    top_k: int = 0  # sampling only; 0: off
    seed: int = 0
    batch_size: int = 8  # conversations in flight (continuous) or per batch (static)
    batching: str = "continuous"  # continuous: a finished conversation frees its slot | static: whole-batch turns
    max_rows: int | None = None  # read only the first N input rows
    max_turns: int | None = None  # replies per conversation
    max_length: int = 1024  # no reply to a prompt of this many tokens or more (data.max_length)
    device: str = "auto"
    dtype: str = "float32"

    def settings(self) -> dict[str, Any]:
        """Everything that decides a row's content; a resumed run must match it."""
        name = self.target_name or Path(self.target).name
        keys = ("data", "dtype", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "max_turns",
                "max_length")
        return {"target": name, "target_path": self.target, **{k: getattr(self, k) for k in keys}}

    def check(self) -> None:
        if self.batch_size < 1 or self.max_new_tokens < 1 or self.max_length < 1:
            raise ValueError("batch_size, max_new_tokens and max_length must be positive")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be continuous or static, got {self.batching!r}")


@dataclass
class Source:
    """One input conversation, planned: the prompt messages before each reply to generate."""

    row_id: str
    line: int
    turns: list[list[Message]]  # turns[r]: system/user messages that precede reply r


@dataclass
class Reply:
    token_ids: list[int]  # generated ids, end-of-turn token excluded
    text: str
    finished: bool  # ended with an end-of-turn token (else it hit max_new_tokens)


@dataclass
class GenSummary:
    out: str
    written: int = 0
    already_done: int = 0
    no_user_turn: int = 0
    too_long: int = 0
    turns: int = 0
    new_tokens: int = 0
    unfinished: int = 0
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    def format(self) -> str:
        s = self.settings
        mode = "greedy" if s.get("temperature", 0) == 0 else (
            f"T={s['temperature']} top_p={s['top_p']} top_k={s['top_k']} seed={s['seed']}")
        rate = self.new_tokens / max(self.seconds, 1e-9)
        target = f"{s.get('target')} ({s.get('target_path')})"
        rows = (f"{self.written} written, {self.already_done} already there (skipped), "
                f"{self.no_user_turn} without a user turn, {self.too_long} with a first prompt >= max_length")
        replies = (f"{self.turns} ({self.unfinished} cut at max_new_tokens), {self.new_tokens:,} tokens "
                   f"generated in {self.seconds:.1f} s ({rate:.1f} tok/s)")
        return "\n".join([
            f"splitserve gen -> {self.out}",
            f"  target  {target}, {mode}, <= {s.get('max_new_tokens')} new tokens per reply",
            f"  rows    {rows}",
            f"  replies {replies}",
        ])


# --------------------------------------------------------------------------- reading


def _prompt_row_messages(row: dict, where: str) -> list[Message]:
    """A training row, or a prompt-only row {"prompt", optional "system"}."""
    if "messages" not in row and "prompt" in row and "response" not in row:
        # Validated as a prompt/response row with an empty response, which is then dropped.
        return parse_messages({**row, "response": ""}, where)[:-1]
    return parse_messages(row, where)


def plan_turns(messages: list[Message]) -> list[list[Message]]:
    """Split a conversation at its assistant turns: the non-assistant messages before each reply."""
    turns: list[list[Message]] = []
    pending: list[Message] = []
    for msg in messages:
        if msg["role"] != "assistant":
            pending.append(msg)
        elif any(m["role"] == "user" for m in pending):
            turns.append(pending)
            pending = []
    if any(m["role"] == "user" for m in pending):
        turns.append(pending)
    return turns


def _row_key(row: dict, messages: list[Message]) -> str:
    rid = row.get("id")
    if isinstance(rid, (str, int)) and not isinstance(rid, bool):
        return str(rid)
    blob = json.dumps(messages, ensure_ascii=False, sort_keys=True).encode()
    return "sha1:" + hashlib.sha1(blob).hexdigest()[:16]


def read_sources(path: str | Path, max_rows: int | None = None) -> list[Source]:
    """Every conversation of a chat data file (errors name file and row), with a stable row id."""
    seen: Counter[str] = Counter()
    out: list[Source] = []
    for lineno, row, where in iter_rows(path):
        if max_rows is not None and len(out) >= max_rows:
            break
        messages = _prompt_row_messages(row, where)
        key = _row_key(row, messages)
        seen[key] += 1
        row_id = key if seen[key] == 1 else f"{key}#{seen[key]}"
        out.append(Source(row_id, lineno, plan_turns(messages)))
    return out


def row_key(source_row: str, sample: int = 0) -> str:
    """The id of one output row: its source row, and which sampled reply (0 for the first)."""
    return source_row if sample == 0 else f"{source_row}~{sample}"


def read_done(out: Path, settings: dict[str, Any]) -> set[str]:
    """Row keys already in `out`. A torn last line (a stop mid-write) is cut off."""
    if not out.exists():
        return set()
    raw = out.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        print(f"[gen] {out}: dropping a torn last line ({len(raw) - keep} bytes)")
        with open(out, "r+b") as f:
            f.truncate(keep)
    done: set[str] = set()
    for lineno, row, where in iter_json_rows(out):
        gen = row.get("gen")
        if not isinstance(gen, dict) or "source_row" not in gen:
            raise DataError(f"{where}: not a row written by splitserve gen (no 'gen.source_row')")
        for key, value in settings.items():
            if gen.get(key) != value:
                raise DataError(
                    f"{where}: written with {key}={gen.get(key)!r}, this run has {key}={value!r}; "
                    "rerun with the same settings to resume, or write to another --out"
                )
        key = row_key(gen["source_row"], gen.get("sample", 0))
        if key in done:
            raise DataError(f"{where}: row {key!r} is in the file twice")
        done.add(key)
    return done


# --------------------------------------------------------------------------- generating


def load_generator(cfg: GenConfig) -> tuple[Any, Any, frozenset[int]]:
    """The target as a plain causal LM (no captured layers needed): model, tokenizer, stop ids."""
    from splitserve.assets import resolve_target_path
    from splitserve.target.hf import DTYPES, load_causal_lm, load_tokenizer, pick_device

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
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
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # (B, T) left-padded
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    sampling = cfg.temperature > 0
    # Every field that could select a logits processor is set, so nothing else applies.
    gc = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens, do_sample=sampling, num_beams=1,
        temperature=cfg.temperature if sampling else None, top_p=cfg.top_p if sampling else None,
        top_k=cfg.top_k if sampling else None, eos_token_id=sorted(stop), pad_token_id=pad,
    )
    dev = next(model.parameters()).device
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc)
    replies = []
    for row in out[:, width:].tolist():  # (B, new) generated ids, padded after a stop
        end = next((j for j, t in enumerate(row) if t in stop), None)
        toks = row if end is None else row[:end]
        text = tokenizer.decode(toks, skip_special_tokens=True)
        replies.append(Reply(toks, text, finished=end is not None))
    return replies


def regenerate(
    model: Any, tokenizer: Any, sources: list[Source], cfg: GenConfig, stop: set[int]
) -> list[tuple[list[Message], list[Reply]]]:
    """Replay a batch of conversations turn by turn; -> (messages, replies) per source."""
    limit = cfg.max_turns if cfg.max_turns is not None else max(len(s.turns) for s in sources)
    messages: list[list[Message]] = [[] for _ in sources]
    replies: list[list[Reply]] = [[] for _ in sources]
    active = list(range(len(sources)))
    for r in range(limit):
        going, prompts = [], []
        for i in active:
            if r >= len(sources[i].turns):
                continue
            ids = encode_prompt(tokenizer, messages[i] + sources[i].turns[r])
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
    for s in sources:
        if not s.turns:
            summary.no_user_turn += 1
        elif len(encode_prompt(tokenizer, s.turns[0])) >= cfg.max_length:
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
            from splitserve.data.gen_continuous import regenerate_continuous

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


def config_from_args(args: Any) -> GenConfig:
    """An argparse namespace whose names are GenConfig fields -> GenConfig."""
    names = {f.name for f in dataclasses.fields(GenConfig)}
    return GenConfig(**{k: v for k, v in vars(args).items() if k in names})
