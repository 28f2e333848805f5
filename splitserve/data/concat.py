"""Long training rows from real text: consecutive conversations joined into one row.

Long-context training needs rows of thousands of tokens, and most chat data is short (chitchat's
median conversation is about 100 tokens). `data.concat_to=C` packs consecutive tokenized
conversations, in file order, into rows of at most C tokens (C <= data.max_length): each row is
the conversations' own token ids and loss masks one after the other, so every trained label is a
real reply and the target reads real text across the whole row. A conversation longer than C
(up to max_length) stays a row of its own. No padding, no token dropped.
"""

from __future__ import annotations

from splitserve.data.chat import TokenizedSample


def concatenate(samples: list[TokenizedSample], concat_to: int) -> list[TokenizedSample]:
    """Consecutive samples joined while the row stays within concat_to tokens; sources become
    'first .. last' (the rows they came from)."""
    rows: list[TokenizedSample] = []
    group: list[TokenizedSample] = []

    def close() -> None:
        if group:
            source = group[0].source if len(group) == 1 else f"{group[0].source} .. {group[-1].source}"
            rows.append(TokenizedSample([t for s in group for t in s.input_ids], [m for s in group for m in s.loss_mask],
                                        source, any(s.truncated for s in group)))
            group.clear()

    length = 0
    for sample in samples:
        if group and length + len(sample.input_ids) > concat_to:
            close()
            length = 0
        group.append(sample)
        length += len(sample.input_ids)
    close()
    return rows
