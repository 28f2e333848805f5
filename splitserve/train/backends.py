"""Optimisation backends for the draft: one seam, two implementations.

`PlainBackend`      torch AdamW + warmup/cosine schedule; in a data-parallel group the
                    gradients are summed with one all-reduce per optimiser step. Used for
                    single-process training and for the CPU tests.
`DeepSpeedBackend`  DeepSpeed ZeRO stage 1 or 2 over the draft ranks' process group only,
                    with gradient accumulation and bf16; its config is generated from
                    `TrainConfig` by `deepspeed_config`.

Contract (both): the caller hands `backward` a micro-batch loss already scaled by
(micro-batch weight / global weight), so that the *sum* over all micro-batches and ranks is the
global batch loss. `step()` is called once per optimiser step, after every micro-batch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Protocol

import torch
import torch.distributed as dist

from splitserve.config import TrainConfig


def lr_lambda(warmup: int, total: int):
    """Linear warmup, then cosine decay to 10% of the peak."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def resume_schedule(sched: torch.optim.lr_scheduler.LambdaLR) -> None:
    """After a checkpoint's schedule state is loaded: each group's rate is this run's schedule at the
    step reached. With the same max_steps that is the rate saved; with a raised one, the saved rate
    is the old schedule's and would drive the first resumed step."""
    for group, base, f in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * f(sched.last_epoch)
    sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]  # what get_last_lr() reports


class TrainBackend(Protocol):
    module: torch.nn.Module  # the draft as the forward should call it

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Reduce gradients, clip, update, zero; returns the global gradient norm."""

    @property
    def lr(self) -> float: ...

    def save(self, ckpt_dir: Path, writer: bool) -> None:
        """Optimiser and schedule state into a checkpoint dir (every draft rank calls it)."""

    def load(self, ckpt_dir: Path) -> None: ...


def _trainable(draft: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in draft.parameters() if p.requires_grad]


def param_groups(draft: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """The trainable parameters as AdamW groups: the Markov head at `lr * markov_lr_scale`
    (when that is not 1), everything else at `lr`. The schedule scales every group alike."""
    markov = getattr(draft, "markov", None)
    head = {id(p) for p in markov.parameters()} if markov is not None and cfg.markov_lr_scale != 1.0 else set()
    trainable = _trainable(draft)
    groups = [{"params": [p for p in trainable if id(p) not in head], "lr": cfg.lr}]
    if head:
        groups.append({"params": [p for p in trainable if id(p) in head], "lr": cfg.lr * cfg.markov_lr_scale})
    return groups


def _optimizer(groups: list[dict], cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its warmup/cosine schedule: the same recipe whichever backend steps them."""
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.warmup_steps, cfg.max_steps))


class PlainBackend:
    def __init__(self, draft: torch.nn.Module, cfg: TrainConfig, group: dist.ProcessGroup | None = None):
        self.module, self.cfg, self.group = draft, cfg, group
        self.params = _trainable(draft)
        self.opt, self.sched = _optimizer(param_groups(draft, cfg), cfg)
        self._dp = dist.get_world_size(group) if dist.is_initialized() and group is not None else 1

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _all_reduce_grads(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # (n_params,) one message per step
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n

    def step(self) -> float:
        if self._dp > 1:
            self._all_reduce_grads()
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return float(gnorm)

    @property
    def lr(self) -> float:
        return self.sched.get_last_lr()[0]

    def save(self, ckpt_dir: Path, writer: bool) -> None:
        # Every rank applies the same reduced gradient, so rank 0's state is everyone's.
        if writer:
            state = {"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}
            torch.save(state, Path(ckpt_dir) / "optim.pt")

    def load(self, ckpt_dir: Path) -> None:
        state = torch.load(Path(ckpt_dir) / "optim.pt", map_location="cpu", weights_only=True)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        resume_schedule(self.sched)


def deepspeed_config(cfg: TrainConfig, dp_size: int, micro_batch: int, bf16: bool) -> dict:
    """The DeepSpeed JSON config for this run, derived from the typed config (never hand-written)."""
    if cfg.zero_stage not in (1, 2):
        raise ValueError(f"train.zero_stage must be 1 or 2 for the draft (it is small), got {cfg.zero_stage}")
    return {
        "train_batch_size": micro_batch * cfg.grad_accum_steps * dp_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum_steps,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": cfg.zero_stage == 2},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,  # splitserve logs; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
    }


class DraftGroupMPU:
    """The model-parallel-unit interface DeepSpeed asks for: the draft ranks' group is the
    data-parallel group, and model/tensor parallelism is a group of this rank alone.

    Without it DeepSpeed would reduce over the whole world, target ranks included, and hang.
    `own_group` must be a process group holding only this rank (see `singleton_groups`).
    """

    def __init__(self, dp_group: dist.ProcessGroup | None, own_group: dist.ProcessGroup | None):
        self.dp_group, self.own_group = dp_group, own_group

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self) -> int:
        return dist.get_world_size(self.dp_group)

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self.dp_group)

    def get_data_parallel_group_ranks(self) -> list[int]:
        return dist.get_process_group_ranks(self.dp_group)

    def get_model_parallel_group(self):
        return self.own_group

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_tensor_model_parallel_src_rank(self) -> int:
        return dist.get_rank()


def singleton_groups(backend: str | None = None) -> dist.ProcessGroup:
    """Every rank creates one group per rank (new_group is collective); returns this rank's."""
    groups = [dist.new_group([r], backend=backend) for r in range(dist.get_world_size())]
    return groups[dist.get_rank()]


class DeepSpeedBackend:
    def __init__(
        self,
        draft: torch.nn.Module,
        cfg: TrainConfig,
        group: dist.ProcessGroup | None,
        micro_batch: int,
        bf16: bool,
        own_group: dist.ProcessGroup | None = None,
    ):
        try:
            import deepspeed
        except ImportError as exc:
            raise RuntimeError("train.backend=deepspeed needs DeepSpeed: pip install 'splitserve[deepspeed]'") from exc
        self.cfg = cfg
        self._dp = dist.get_world_size(group) if group is not None else 1
        params = _trainable(draft)
        opt, sched = _optimizer(param_groups(draft, cfg), cfg)
        self.config = deepspeed_config(cfg, self._dp, micro_batch, bf16)
        # DeepSpeed picks its GPU from LOCAL_RANK; ranks sharing a GPU (or a placement that is
        # not LOCAL_RANK) need the draft's own device named explicitly.
        device = next(draft.parameters()).device
        args = SimpleNamespace(device_rank=device.index or 0) if device.type == "cuda" else None
        self.engine, _, _, _ = deepspeed.initialize(
            args=args,
            model=draft,
            model_parameters=params,
            optimizer=opt,
            lr_scheduler=sched,
            config=self.config,
            mpu=DraftGroupMPU(group, own_group),
        )
        self.module = self.engine.module

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed divides by the accumulation steps and averages over data-parallel ranks;
        # the caller's loss is already a share of the global sum, so undo both.
        self.engine.backward(loss * (self._dp * self.cfg.grad_accum_steps))
        # DeepSpeed counts micro-batches itself: this updates only at the accumulation boundary.
        self.engine.step()

    def step(self) -> float:
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @property
    def lr(self) -> float:
        return self.engine.get_lr()[0]

    # DeepSpeed's own save_checkpoint/load_checkpoint synchronise over the *default* process
    # group, which here includes the target ranks (they would never join, and the job would
    # hang). So each draft rank stores its own ZeRO partition (plain torch.save, no collective)
    # and the full weights come from the writer's draft.safetensors.
    def _dp_rank(self) -> int:
        return dist.get_rank(self.engine.optimizer.dp_process_group)

    def save(self, ckpt_dir: Path, writer: bool) -> None:
        state = {
            "dp_size": self._dp,
            "optimizer": self.engine.optimizer.state_dict(),
            "scheduler": self.engine.lr_scheduler.state_dict(),
            "global_steps": self.engine.global_steps,
            "global_samples": self.engine.global_samples,
        }
        torch.save(state, Path(ckpt_dir) / f"zero_dp{self._dp_rank()}.pt")

    def load(self, ckpt_dir: Path) -> None:
        path = Path(ckpt_dir) / f"zero_dp{self._dp_rank()}.pt"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the checkpoint was written by a different number "
                                    f"of draft ranks or by the plain backend (this run has {self._dp})")
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: ZeRO metadata
        if state["dp_size"] != self._dp:
            raise ValueError(f"{path} holds a ZeRO partition for {state['dp_size']} draft ranks; "
                             f"this run has {self._dp}")
        parts = [None] * self._dp
        parts[self._dp_rank()] = state["optimizer"]
        self.engine.optimizer.load_state_dict(parts, load_optimizer_states=True, load_from_fp32_weights=True)
        self.engine.lr_scheduler.load_state_dict(state["scheduler"])
        resume_schedule(self.engine.lr_scheduler)
        self.engine.global_steps = state["global_steps"]
        self.engine.global_samples = state["global_samples"]


def _single_process_group() -> None:
    """DeepSpeed always wants torch.distributed; give a lone process a world of one."""
    import socket

    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)


def make_backend(
    draft: torch.nn.Module,
    cfg: TrainConfig,
    group: dist.ProcessGroup | None = None,
    micro_batch: int = 1,
    bf16: bool = False,
    own_group: dist.ProcessGroup | None = None,
) -> TrainBackend:
    if cfg.backend == "plain":
        return PlainBackend(draft, cfg, group)
    if cfg.backend == "deepspeed":
        if not dist.is_initialized():
            _single_process_group()
        return DeepSpeedBackend(draft, cfg, group, micro_batch, bf16, own_group)
    raise ValueError(f"train.backend must be 'plain' or 'deepspeed', got {cfg.backend!r}")
