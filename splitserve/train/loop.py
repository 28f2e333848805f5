"""`splitserve train`: distil a DSpark draft from a frozen target, then measure it.

Reads top to bottom like a recipe: target -> draft -> data -> optimiser -> resume -> steps ->
checkpoint -> held-out evaluation -> summary.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from splitserve.config import RunConfig
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.io import save_arch
from splitserve.train.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from splitserve.train.sources import DataOrder, DumpSource, TargetSource
from splitserve.train.step import collate, draft_loss


def lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def build_source(cfg: RunConfig, target):
    """An offline dump if configured, else the target run in-process over tokenized data."""
    if cfg.data.dump_dir:
        from splitserve.offline import DumpReader

        reader = DumpReader(cfg.data.dump_dir)
        reader.check_target(target.info)
        print(f"[train] reading {len(reader)} samples from dump {cfg.data.dump_dir}")
        return DumpSource(reader)
    from splitserve.data import load_samples, resolve_train_path

    path = resolve_train_path(cfg.data.train_path)
    samples, stats = load_samples(path, target.tokenizer, cfg.data.max_length, cfg.data.max_samples)
    print(f"[train] data {path}: {stats.summary()}")
    return TargetSource(target, samples)


class Logger:
    """metrics.jsonl in the run dir, and wandb (offline unless configured) when enabled."""

    def __init__(self, run_dir: Path, cfg: RunConfig):
        self.file = open(run_dir / "metrics.jsonl", "a")
        self.wandb = None
        if cfg.train.wandb:
            import os

            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            self.wandb = wandb.init(project=cfg.train.wandb_project, dir=str(run_dir), config=asdict(cfg),
                                    name=run_dir.name, resume="allow", id=run_dir.name.replace("/", "_"))

    def log(self, step: int, metrics: dict) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


@dataclass
class TrainResult:
    draft: object
    state: TrainState
    target: object


def train(cfg: RunConfig, target=None) -> TrainResult:
    """Train (or resume) the run in cfg.run_dir."""
    from splitserve.target.hf import load_hf_target, pick_device

    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.train.device)
    target = target or load_hf_target(cfg.target, device)
    torch.manual_seed(cfg.train.seed)
    arch = resolve_arch(cfg.draft, target.info, target.model.config, target.tokenizer)
    draft = build_draft(arch, target).float()
    save_arch(run_dir, arch, cfg.target.path)
    source = build_source(cfg, target)
    order = DataOrder(source.num_samples, cfg.train.batch_size, cfg.train.seed)

    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.train.warmup_steps, cfg.train.max_steps))
    state = TrainState()
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt, draft, opt, sched)
        print(f"[train] resumed from {ckpt} (step {state.step}{', finished' if state.finished else ''})")
    n_train = sum(p.numel() for p in params)
    print(f"[train] draft: {arch.num_layers} layers, γ={arch.block_size}, markov_rank={arch.markov_rank}, "
          f"{n_train / 1e6:.1f}M trainable params; target {target.info.name} layers {list(arch.target_layer_ids)}")

    logger = Logger(run_dir, cfg)
    t_start, elapsed0 = time.time(), state.elapsed_s
    budget_s = cfg.train.max_minutes * 60 if cfg.train.max_minutes else math.inf
    bar = tqdm(total=cfg.train.max_steps, initial=state.step, desc="train", unit="step", disable=state.finished)
    window: list[dict] = []
    draft.train()
    while not state.finished and state.step < cfg.train.max_steps:
        records = source.get(order.batch(state.step))
        batch = collate(records, device, torch.float32)
        gen = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + state.step)
        out, n_pos = draft_loss(draft, batch, cfg.train.anchors_per_seq, cfg.loss, gen)
        opt.zero_grad(set_to_none=True)
        out.total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        sched.step()
        state.step += 1
        state.samples_seen += len(records)
        state.tokens_seen += batch.num_tokens
        state.positions_trained += n_pos
        state.elapsed_s = elapsed0 + time.time() - t_start
        window.append({**out.metrics(), "grad_norm": float(gnorm)})
        bar.update(1)
        if state.step % cfg.train.log_every == 0 or state.step == cfg.train.max_steps:
            avg = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            avg.update(lr=sched.get_last_lr()[0], tokens_seen=state.tokens_seen,
                       tok_per_s=state.tokens_seen / max(state.elapsed_s, 1e-9))
            logger.log(state.step, avg)
            bar.set_postfix(loss=f"{avg['loss']:.3f}", alpha=f"{avg['alpha']:.3f}")
            window = []
        out_of_time = state.elapsed_s - elapsed0 >= budget_s
        if out_of_time or state.step >= cfg.train.max_steps:
            state.finished = True
        if state.finished or state.step % cfg.train.save_every == 0:
            save_checkpoint(run_dir, draft, opt, sched, state)
    bar.close()
    logger.close()
    print(f"[train] done: {state.step} steps, {state.tokens_seen:,} target tokens, "
          f"{state.positions_trained:,} block positions, {state.elapsed_s / 60:.1f} min")
    return TrainResult(draft.eval(), state, target)
