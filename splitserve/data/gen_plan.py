"""What `splitserve gen` reads and resumes, whichever way it generates: the settings
(GenConfig, in splitserve/config/), the input conversations planned into the turns to answer
(Source), and the row keys an output file already holds. gen.py (in process) and
gen_remote.py (through servers) build on it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitserve.config import GenConfig
from splitserve.data.chat import ChatTemplate, Message, parse_messages
from splitserve.data.rows import DataError, iter_json_rows, iter_rows

FORMAT_VERSION = 1


def gen_chat(cfg: GenConfig) -> ChatTemplate:
    """The chat template a GenConfig renders prompts with."""
    return ChatTemplate.load(cfg.chat_template, cfg.chat_template_kwargs)


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
    """What a run did, for its closing summary."""

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
