"""Training conversations and evaluation prompts.

`resolve_train_path` / `resolve_prompts_path` accept either the name of the embedded default
("chitchat") or a path to a data file (JSONL, Parquet, Arrow, or a `save_to_disk` directory);
nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

from splitserve.assets import CHITCHAT_NAME
from splitserve.data.chat import (
    DataError,
    DataStats,
    TokenizedSample,
    load_samples,
    read_conversations,
    render_chat,
    tokenize_conversation,
)
from splitserve.data.chitchat import ChitchatPaths, chitchat_paths
from splitserve.data.prompt_sets import SETS, prompt_set_path
from splitserve.data.prompts import encode_prompt, read_prompts

__all__ = [
    "ChitchatPaths",
    "DataError",
    "DataStats",
    "TokenizedSample",
    "chitchat_paths",
    "encode_prompt",
    "load_samples",
    "read_conversations",
    "read_prompts",
    "render_chat",
    "resolve_prompts_path",
    "resolve_train_path",
    "tokenize_conversation",
]


def _existing_file(name_or_path: str, what: str) -> str:
    if not Path(name_or_path).exists():
        raise DataError(
            f"{what} '{name_or_path}' is neither '{CHITCHAT_NAME}' (the embedded default) "
            "nor an existing data file (JSONL, Parquet, Arrow or a save_to_disk directory)"
        )
    return name_or_path


def resolve_train_path(name_or_path: str) -> str:
    """Training conversations: "chitchat" -> its converted train split, else an existing file."""
    if name_or_path == CHITCHAT_NAME:
        return str(chitchat_paths().train)
    return _existing_file(name_or_path, "training data")


def resolve_prompts_path(name_or_path: str) -> str:
    """Evaluation prompts: "chitchat" -> its held-out prompts, a named set of data/prompt_sets.py
    ("humaneval", "mtbench", "mtbench2"), else an existing file."""
    if name_or_path == CHITCHAT_NAME:
        return str(chitchat_paths().heldout_prompts)
    if name_or_path in SETS and not Path(name_or_path).exists():
        return str(prompt_set_path(name_or_path))
    return _existing_file(name_or_path, "prompts")
