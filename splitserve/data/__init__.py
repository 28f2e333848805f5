"""Training conversations and evaluation prompts.

`resolve_train_path` / `resolve_prompts_path` accept either the name of the embedded default
("chitchat") or a data path: a JSONL/JSON, Parquet or Arrow file, a `save_to_disk` directory, or a
glob of files (docs/data.md); nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

from splitserve.assets import CHITCHAT_NAME
from splitserve.data.chat import (
    ChatTemplate,
    DataError,
    TokenizedSample,
    read_conversations,
    render_chat,
    tokenize_conversation,
)
from splitserve.data.chitchat import ChitchatPaths, chitchat_paths
from splitserve.data.prompt_sets import SETS, prompt_set_path
from splitserve.data.prompts import encode_prompt, read_prompts
from splitserve.data.rows import FORMATS, expand
from splitserve.data.samples import DataStats, LoadOptions, load_samples

__all__ = [
    "ChatTemplate",
    "ChitchatPaths",
    "DataError",
    "DataStats",
    "LoadOptions",
    "TokenizedSample",
    "chitchat_paths",
    "load_options",
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
    try:
        found = all(p.exists() for p in expand(name_or_path))
    except DataError:  # a glob matching nothing
        found = False
    if not found:
        raise DataError(
            f"{what} '{name_or_path}' is neither '{CHITCHAT_NAME}' (the embedded default) "
            f"nor an existing data path ({FORMATS}, or a glob of them)"
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


def load_options(data_cfg) -> LoadOptions:
    """LoadOptions from a config.DataConfig: its template file and kwargs, strictness, workers, cache."""
    chat = ChatTemplate.load(data_cfg.chat_template, dict(data_cfg.chat_template_kwargs or {}))
    return LoadOptions(chat=chat, strict=data_cfg.strict, num_proc=data_cfg.num_proc, cache=data_cfg.cache,
                       overlong=data_cfg.overlong, concat_to=data_cfg.concat_to, loss_on=data_cfg.loss_on)
