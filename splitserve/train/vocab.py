"""A draft's reduced vocabulary, fitted to the training data before the first step: the N most
frequent trained tokens of the whole training set (models/vocab_map.py). EAGLE-3 always has one;
a DSpark or DFlash draft when draft.draft_vocab_size is set. Checkpoints keep the map (d2t, t2d),
so a resumed run reads it back over the fitted one."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from splitserve.config import RunConfig
from splitserve.models.vocab_map import build_vocab_map, count_tokens


def training_tokens(cfg: RunConfig, target, source) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) of the whole training set, without the target's hidden states:
    the tokenized samples of an in-process source, the index part of a dump's shards, or (a
    split job's draft ranks, which receive records only) the data tokenized as the target ranks
    tokenize it (data.cache keeps it)."""
    samples = getattr(source, "samples", None)
    if samples is None and cfg.data.dump_dir:
        from splitserve.stream.dump_reader import DumpReader, read_shard

        reader = DumpReader(cfg.data.dump_dir)
        for entry in reader.manifest["shards"]:
            shard = read_shard(reader.dump_dir / entry["file"], states=False)
            yield shard.input_ids, shard.loss_mask
        return
    if samples is None:
        from splitserve.data import load_options, load_samples, resolve_train_path

        samples, _ = load_samples(resolve_train_path(cfg.data.train_path), target.tokenizer, cfg.data.max_length,
                                  cfg.data.max_samples, load_options(cfg.data))
    for s in samples:
        yield s.input_ids, s.loss_mask


def fit_vocab(draft, size: int, cfg: RunConfig, target, source) -> str:
    """Count the trained tokens of the training set, give `draft` (any family with `set_vocab`)
    the map of the `size` most frequent -> the log line that says so."""
    counts = count_tokens(training_tokens(cfg, target, source), draft.arch.vocab_size)  # (V,)
    vocab = build_vocab_map(counts, size)
    draft.set_vocab(vocab)
    covered = float(counts[vocab.used.cpu()].sum()) / max(float(counts.sum()), 1.0)
    return (f"draft vocabulary: {vocab.size:,} of the target's {draft.arch.vocab_size:,} tokens, the most frequent "
            f"trained ones ({int((counts > 0).sum()):,} distinct in the data), covering {covered:.1%} of them")
