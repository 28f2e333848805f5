"""Token ids in, text deltas out: incremental detokenization with OpenAI-style stop strings.

Each push decodes only a short window (the previous chunk and the new one), never the whole
reply, so streaming costs O(new tokens) per round. A delta is held back while it ends inside a
multi-byte character (decoded as U+FFFD) or could still grow into a stop string.
"""

from __future__ import annotations

import contextlib
from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str] | None = None, lock: Any = None):
        self.tok = tokenizer
        self.lock = lock or contextlib.nullcontext()  # shared with other threads using the tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: tokens decoded once already, kept for context
        self.read_offset = 0  # tokens whose text is already in self.text
        self.text = ""  # decoded so far
        self.sent = 0  # characters of self.text handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tok.decode(ids, skip_special_tokens=True)

    def _advance(self, final: bool) -> None:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and (final or not full.endswith(REPLACEMENT)):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)

    def push(self, ids: list[int]) -> str:
        """New token ids -> the text that may be sent now ('' once a stop string was seen)."""
        if self.stopped:
            return ""
        self.ids += ids
        self._advance(final=False)
        return self._release(final=False)

    def finish(self) -> str:
        """The generation ended: flush whatever was held back."""
        if self.stopped:
            return ""
        self._advance(final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        for s in self.stop:
            at = self.text.find(s, self.sent)  # held-back tails keep an earlier match from being sent
            if at != -1:
                out, self.sent, self.stopped = self.text[self.sent : at], at, True
                return out
        safe = len(self.text)
        if self.stop and not final:  # the tail could still become a stop string
            safe = max(self.sent, safe - max(len(s) for s in self.stop) + 1)
        out, self.sent = self.text[self.sent : safe], safe
        return out
