"""The embedded default conversations: chitchat-dataset (MIT) converted to chat JSONL.

The package ships one JSON file of 7,168 human-to-human chats. Neither speaker is a model, so
we call whoever spoke first the user and the other the assistant. The train/held-out split is a
hash of the conversation id, so it is identical on every machine and every run without storing
a split list.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from splitserve.assets import cache_dir, package_dir
from splitserve.data.chat import Message

PIP_NAME = "chitchat-dataset==0.9.0"
HELDOUT_MODULUS = 50  # 1 in 50 conversations (~2%) is held out
MAX_PROMPT_USER_TURN = 3  # held-out prompts stop at the 1st, 2nd or 3rd user turn


@dataclass
class ChitchatPaths:
    train: Path
    heldout: Path
    heldout_prompts: Path

    def all(self) -> tuple[Path, Path, Path]:
        return self.train, self.heldout, self.heldout_prompts


def _conv_hash(conv_id: str) -> int:
    return int(hashlib.sha1(conv_id.encode("utf-8")).hexdigest(), 16)


def is_heldout(conv_id: str) -> bool:
    return _conv_hash(conv_id) % HELDOUT_MODULUS == 0


def to_messages(turns: list[list[dict[str, Any]]]) -> list[Message]:
    """One chitchat conversation as alternating user/assistant messages."""
    messages: list[Message] = []
    senders: list[str] = []  # sender id of each entry in `messages`
    first_sender: str | None = None
    for turn in turns:
        for utterance in turn:
            text = utterance["text"].strip()
            if not text:
                continue
            sender = utterance["sender"]
            # The first sender who actually says something is the user, so every conversation
            # opens with a user turn.
            if first_sender is None:
                first_sender = sender
            if senders and senders[-1] == sender:
                # Later utterances of the same turn, or a turn by the same sender after an empty
                # one was skipped: one message per uninterrupted stretch of one speaker.
                messages[-1]["content"] += "\n" + text
            else:
                role = "user" if sender == first_sender else "assistant"
                messages.append({"role": role, "content": text})
                senders.append(sender)
    return messages


def prompt_prefix(messages: list[Message], conv_hash: int) -> list[Message] | None:
    """The conversation up to and including one answered user turn, or None if none is answered."""
    answered = [
        i
        for i in range(len(messages) - 1)
        if messages[i]["role"] == "user" and messages[i + 1]["role"] == "assistant"
    ]
    if not answered:
        return None
    k = min(conv_hash % MAX_PROMPT_USER_TURN, len(answered) - 1)
    return messages[: answered[k] + 1]


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    # Write next to the target and rename, so an interrupted conversion never leaves a file
    # that looks complete; the pid keeps two processes converting at once apart.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def convert(paths: ChitchatPaths) -> None:
    src = package_dir("chitchat_dataset", PIP_NAME) / "dataset.json"
    with open(src, encoding="utf-8") as f:
        raw: dict[str, dict[str, Any]] = json.load(f)
    train: list[dict[str, Any]] = []
    heldout: list[dict[str, Any]] = []
    prompts: list[dict[str, Any]] = []
    for conv_id, conv in raw.items():
        messages = to_messages(conv["messages"])
        if not messages:
            continue
        h = _conv_hash(conv_id)
        row = {"id": conv_id, "messages": messages}
        if h % HELDOUT_MODULUS != 0:
            train.append(row)
            continue
        heldout.append(row)
        prefix = prompt_prefix(messages, h)
        if prefix is not None:
            prompts.append({"id": conv_id, "messages": prefix})
    paths.train.parent.mkdir(parents=True, exist_ok=True)
    _write_jsonl(paths.train, train)
    _write_jsonl(paths.heldout, heldout)
    _write_jsonl(paths.heldout_prompts, prompts)
    print(
        f"[splitserve] converted chitchat-dataset: {len(raw)} conversations -> "
        f"{len(train)} train, {len(heldout)} held out, {len(prompts)} held-out prompts",
        flush=True,
    )


def chitchat_paths() -> ChitchatPaths:
    """Paths of the converted chitchat JSONL files, converting on first use."""
    root = cache_dir() / "data" / "chitchat"
    paths = ChitchatPaths(
        train=root / "train.jsonl",
        heldout=root / "heldout.jsonl",
        heldout_prompts=root / "heldout_prompts.jsonl",
    )
    if not all(p.exists() for p in paths.all()):
        convert(paths)
    return paths
