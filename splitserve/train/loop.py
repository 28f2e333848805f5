"""`splitserve train`: distil a draft from a frozen target, then measure it.

Reads top to bottom like a recipe: target -> draft -> data -> optimiser -> resume -> steps ->
checkpoint -> held-out evaluation -> summary. The draft's family (draft.family) enters through
two seams only: models/build.py resolves and builds its model, train/objectives.py turns a
batch into its loss.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

import torch

from splitserve.config import RunConfig, save_resolved
from splitserve.models.build import build_draft, resolve_arch
from splitserve.models.families import get_family
from splitserve.models.run_files import check_arch, save_arch
from splitserve.stream.sources import DataOrder, DumpSource, RecordSource, TargetSource
from splitserve.target.backend import CaptureTarget, TargetWeights
from splitserve.target.capture_check import check_capture_varies
from splitserve.train.backends import make_backend
from splitserve.train.checkpoint import TrainState, reopen_if_extended, resume_checkpoint, save_checkpoint
from splitserve.train.objectives import objective_for
from splitserve.train.partition import Partition
from splitserve.train.progress import ProgressBar
from splitserve.train.step import collate, row_generators


def build_source(cfg: RunConfig, target: CaptureTarget, quiet: bool = False, store_dtype: torch.dtype = torch.float32):
    """An offline dump if configured, else the target run in-process over tokenized data."""
    if cfg.data.dump_dir:
        from splitserve.stream import DumpReader

        reader = DumpReader(cfg.data.dump_dir)
        reader.check_target(target.info)
        if not quiet:
            print(f"[train] reading {len(reader)} samples from dump {cfg.data.dump_dir}")
        return DumpSource(reader)
    from splitserve.data import DataError, load_options, load_samples, resolve_train_path
    from splitserve.target.bucketed import use_capture_graphs

    graphs = use_capture_graphs(cfg.target, target.device)
    path = resolve_train_path(cfg.data.train_path)
    samples, stats = load_samples(path, target.tokenizer, cfg.data.max_length, cfg.data.max_samples,
                                  load_options(cfg.data))
    if not samples:
        raise DataError(f"{path}: no training samples ({stats.summary()}; data.max_length={cfg.data.max_length})")
    if not quiet:
        print(f"[train] data {path}: {stats.summary()}")
    return TargetSource(target, samples, store_dtype, bucketed=graphs,
                        group_tokens=cfg.target.capture_group_tokens)


class Logger:
    """metrics.jsonl in the run dir, and wandb (offline unless configured) when enabled."""

    def __init__(self, run_dir: Path, cfg: RunConfig):
        self.file = open(run_dir / "metrics.jsonl", "a")
        self.wandb = None
        if cfg.train.wandb:
            import os

            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("train.wandb=true needs wandb: pip install 'splitserve[wandb]'") from exc

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


@dataclass
class StepTotals:
    """Sums over one optimiser step's micro-batches (and, after `Partition.sum`, its ranks)."""

    loss: float = 0.0
    ce: float = 0.0
    tv: float = 0.0
    conf: float = 0.0
    alpha_sum: float = 0.0
    tokens: float = 0.0
    positions: float = 0.0
    samples: float = 0.0
    out_of_time: float = 0.0

    def add(self, out, share: float, n_tokens: int, n_samples: int) -> None:
        self.loss += float(out.total.detach()) * share
        self.ce += float(out.ce) * share
        self.tv += float(out.tv) * share
        self.conf += float(out.conf) * share
        self.alpha_sum += float(out.alpha.sum())
        self.tokens += n_tokens
        self.positions += out.alpha.numel()
        self.samples += n_samples

    def reduced(self, part: Partition) -> StepTotals:
        return StepTotals(*part.sum(list(astuple(self))))

    def metrics(self, grad_norm: float) -> dict[str, float]:
        alpha = self.alpha_sum / self.positions if self.positions else 0.0
        return {"loss": self.loss, "ce": self.ce, "tv": self.tv, "conf": self.conf, "alpha": alpha,
                "grad_norm": grad_norm}


def micro_batches(per_rank: int, accum: int) -> list[range]:
    if per_rank % accum:
        raise ValueError(f"each draft rank's {per_rank} samples per step do not split into "
                         f"train.grad_accum_steps={accum} equal micro-batches")
    m = per_rank // accum
    return [range(i * m, (i + 1) * m) for i in range(accum)]


def train(
    cfg: RunConfig,
    target: TargetWeights | None = None,
    *,
    source: RecordSource | None = None,
    part: Partition | None = None,
    telemetry: Callable[[float], dict] | None = None,
) -> TrainResult:
    """Train (or resume) the run in cfg.run_dir.

    A single process trains on the whole batch from an in-process target or a dump. In a split
    job each draft rank calls this with its `part`, a `source` fed by the target ranks and a
    target that only shares its weights (target/shared_weights.py; otherwise a `CaptureTarget`);
    `telemetry(wall_s)` then adds channel figures to every log step.
    """
    from splitserve.target import load_target
    from splitserve.target.hf import pick_device

    part = part or Partition()
    objective = objective_for(cfg)  # an unknown family or a loss it cannot train: refused before anything loads
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.train.device)
    target = target or load_target(cfg.target, device)
    if source is None and not cfg.data.dump_dir:  # the records will come from this target's capture
        check_capture_varies(target)
    torch.manual_seed(cfg.train.seed)
    arch = resolve_arch(cfg.draft, target.info, target.config, target.tokenizer)
    check_arch(run_dir, arch, cfg.draft.family)  # before anything in run_dir changes: a refusal leaves it resumable
    draft = build_draft(arch, target).float().to(device)
    source = source or build_source(cfg, target)
    note = objective.prepare(draft, cfg, target, source)  # EAGLE-3: its vocabulary, from the data
    if note and part.writer:
        print(f"[train] {note}")
    order = DataOrder(source.num_samples, cfg.train.batch_size, cfg.train.seed)
    if cfg.train.batch_size % part.size:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} must be a multiple of the {part.size} draft ranks")
    if cfg.train.loss_chunk_rows < 0:
        raise ValueError(f"train.loss_chunk_rows must be >= 0 (0: every block position at once), "
                         f"got {cfg.train.loss_chunk_rows}")
    per_rank = cfg.train.batch_size // part.size
    micro = micro_batches(per_rank, cfg.train.grad_accum_steps)
    bf16 = cfg.train.precision == "bf16"
    backend = make_backend(draft, cfg.train, part.group, micro_batch=len(micro[0]), bf16=bf16,
                           own_group=part.own_group)
    feed_dtype = torch.bfloat16 if bf16 and cfg.train.backend == "deepspeed" else torch.float32

    state = TrainState()
    resumed = resume_checkpoint(run_dir, draft, backend, part)  # a damaged newest one falls back
    if resumed is not None:
        state, ckpt = resumed
        extended = reopen_if_extended(state, cfg.train.max_steps, cfg.train.max_minutes)
        if part.writer:
            print(f"[train] resumed from {ckpt} (step {state.step}{', finished' if state.finished else ''}"
                  f"{'; finished before, training on: ' + extended if extended else ''})")
            if state.finished and state.step < cfg.train.max_steps:
                print("[train] this run finished on its limits; a larger train.max_steps, or another "
                      "train.max_minutes, trains it further")
    if part.writer:  # only now: a checkpoint of another draft shape has been refused, not overwritten
        save_arch(run_dir, arch, cfg.target.path, cfg.draft.family)
        save_resolved(cfg, run_dir)
    n_train = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    if part.writer:
        print(f"[train] draft: {get_family(cfg.draft.family).describe(arch)}, "
              f"{n_train / 1e6:.1f}M trainable params; target {target.info.name} layers {list(arch.target_layer_ids)}; "
              f"{cfg.train.backend} backend, {part.size} draft rank(s) x {len(micro)} micro-batch(es) "
              f"of {len(micro[0])}")

    logger = Logger(run_dir, cfg) if part.writer else None
    t_start, elapsed0 = time.time(), state.elapsed_s
    budget_s = cfg.train.max_minutes * 60 if cfg.train.max_minutes else math.inf
    bar = ProgressBar(cfg.train.max_steps, state.step, budget_s, state.elapsed_s,
                      disable=state.finished or not part.writer)
    window: list[dict] = []
    t_log = time.time()
    draft.train()
    while not state.finished and state.step < cfg.train.max_steps:
        rows = range(part.index * per_rank, (part.index + 1) * per_rank)
        batch_ids = order.batch(state.step)
        records = source.get([batch_ids[r] for r in rows])
        gens = row_generators(cfg.train.seed, state.step, rows)
        planned = []
        for mb in micro:
            batch = collate([records[i] for i in mb], device, feed_dtype)
            plan = objective.plan(draft, batch, [gens[i] for i in mb])
            planned.append((batch, plan, objective.weight(plan)))
        weight_total = max(part.sum([sum(w for _, _, w in planned)])[0], 1e-8)
        totals = StepTotals()
        for batch, plan, w in planned:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = objective.loss(backend.module, batch, plan)
            share = w / weight_total
            backend.backward(out.total * share)
            totals.add(out, share, batch.num_tokens, len(batch.lengths))
        gnorm = backend.step()
        state.elapsed_s = elapsed0 + time.time() - t_start
        totals.out_of_time = float(state.elapsed_s - elapsed0 >= budget_s)
        totals = totals.reduced(part)
        state.step += 1
        state.samples_seen += int(totals.samples)
        state.tokens_seen += int(totals.tokens)
        state.positions_trained += int(totals.positions)
        window.append(totals.metrics(gnorm))
        bar.advance(state.step, state.elapsed_s)
        if state.step % cfg.train.log_every == 0 or state.step == cfg.train.max_steps:
            avg = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            avg.update(lr=backend.lr, tokens_seen=state.tokens_seen,
                       tok_per_s=state.tokens_seen / max(state.elapsed_s, 1e-9))
            if telemetry is not None:
                avg.update(telemetry(time.time() - t_log))
            t_log = time.time()
            if logger is not None:
                logger.log(state.step, avg)
            bar.show(loss=avg["loss"], accept=avg["alpha"])
            window = []
        if totals.out_of_time or state.step >= cfg.train.max_steps:
            state.finished = True
            state.finished_under = [cfg.train.max_steps, cfg.train.max_minutes]
        if state.finished or state.step % cfg.train.save_every == 0:
            save_checkpoint(run_dir, draft, backend, state, keep=cfg.train.keep_checkpoints, part=part)
    bar.close()
    if logger is not None:
        logger.close()
        why = ""
        if state.step < cfg.train.max_steps and state.elapsed_s - elapsed0 >= budget_s:
            why = (f" (the {cfg.train.max_minutes:g}-minute budget, train.max_minutes, ran out before "
                   f"train.max_steps={cfg.train.max_steps})")
        print(f"[train] done: {state.step} steps{why}, {state.tokens_seen:,} target tokens, "
              f"{state.positions_trained:,} block positions, {state.elapsed_s / 60:.1f} min; draft saved in "
              f"{run_dir / 'checkpoints'}")
    return TrainResult(draft.eval(), state, target)
