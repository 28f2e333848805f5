"""`splitserve dump`: run the target over the training data once and store its hidden states.

Samples are processed in data order (sample id = index), so a dump-trained run sees the records
an in-process run would: exactly, when each sample is captured alone (on CPU, or with
target.capture_group_tokens=0); up to the product kernels' rounding when a bucket's samples
share a forward (target/bucketed.py). An interrupted dump resumes where its shards end.
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm import tqdm

from splitserve.config import RunConfig
from splitserve.stream.dump_reader import dtype_from_name
from splitserve.stream.dump_writer import DumpWriter
from splitserve.stream.sources import TargetSource
from splitserve.target.backend import CaptureTarget
from splitserve.target.bucketed import use_capture_graphs
from splitserve.target.capture_check import check_capture_varies


def run_dump(cfg: RunConfig, target: CaptureTarget | None = None) -> Path:
    from splitserve.data import load_options, load_samples, resolve_train_path
    from splitserve.target import load_target

    target = target or load_target(cfg.target)
    check_capture_varies(target)  # a dump of zeroed or input-blind states would train nothing
    path = resolve_train_path(cfg.data.train_path)
    samples, stats = load_samples(path, target.tokenizer, cfg.data.max_length, cfg.data.max_samples,
                                  load_options(cfg.data))
    print(f"[dump] data {path}: {stats.summary()}")
    source = TargetSource(target, samples, bucketed=use_capture_graphs(cfg.target, target.device),
                          group_tokens=cfg.target.capture_group_tokens)
    out = Path(cfg.dump.out_dir)
    resume = out.exists() and not (out / "manifest.json").exists() and any(out.glob("shard_*"))
    t0 = time.time()
    with DumpWriter(out, target.info, dtype_from_name(cfg.dump.dtype), cfg.dump.shard_tokens, resume=resume) as writer:
        todo = [i for i in range(len(samples)) if i not in writer.done_sample_ids]
        if resume:
            print(f"[dump] resuming: {len(samples) - len(todo)} samples already stored")
        bar = tqdm(total=len(todo), desc="dump", unit="sample")
        for start in range(0, len(todo), cfg.train.batch_size):
            for rec in source.get(todo[start : start + cfg.train.batch_size]):
                writer.add(rec)
            bar.update(min(cfg.train.batch_size, len(todo) - start))
        bar.close()
    tokens = sum(len(s.input_ids) for s in samples)
    print(f"[dump] wrote {len(samples)} samples, {tokens:,} tokens to {out} in {time.time() - t0:.0f} s")
    return out
