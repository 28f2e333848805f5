"""Find and load a trained draft and its target: the one loader every command uses.

    run dir:    draft_arch.json (its family and arch) + checkpoints/latest -> trainable weights;
                shared weights are copied from the target
    export dir: config.json (architectures = ["DSparkDraftModel"]) + model.safetensors
The draft's metadata is read once per command (read_draft_meta -> DraftMeta, handed on to the
loaders) and checked against the target's config before any weight is read, so a draft made for
another target is refused at start with every difference named (DraftMismatchError). Which
target a draft runs against is decided in one place, target_config_for."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from splitserve.config import ModelsConfig, TargetConfig
from splitserve.models.build import check_compatible
from splitserve.errors import UserError
from splitserve.models.families import get_family
from splitserve.models.run_files import ARCH_FILE, CheckpointError, latest_checkpoint, load_weights
from splitserve.speculative.calibration_file import load_calibration, temperatures_for
from splitserve.target.backend import TargetWeights


@dataclass(frozen=True)
class DraftMeta:
    """What a draft directory says about itself, read without its weights."""

    path: Path
    arch: object  # the family's arch (models/families.py): a DSparkArch, an Eagle3Arch
    kind: str  # "run" (draft_arch.json + checkpoints) | "export" (config.json + model.safetensors)
    target_path: str | None  # the target a run trained against; None for an export
    family: str = "dspark"  # draft.family


def read_draft_meta(path: str | Path) -> DraftMeta:
    path = Path(path)
    if (path / ARCH_FILE).exists():
        meta = json.loads((path / ARCH_FILE).read_text())
        family = get_family(meta.get("family", "dspark"))  # a file written before families: DSpark
        return DraftMeta(path, family.arch.from_dict(meta["arch"]), "run", meta.get("target_path"), family.name)
    if (path / "config.json").exists():
        from splitserve.export.hf import ARCHITECTURE, DSparkConfig, required_config_keys

        raw = json.loads((path / "config.json").read_text())
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ValueError(f"{path}/config.json is not a DSpark draft (architectures={raw.get('architectures')})")
        missing = [key for key in required_config_keys() if key not in raw]
        if missing:  # the config class would fill them with its defaults (block_size 8, ...): a wrong draft
            raise ValueError(f"{path}/config.json lacks {', '.join(missing)}, which every DSpark export states")
        return DraftMeta(path, DSparkConfig.from_pretrained(path).to_arch(), "export", None)
    raise FileNotFoundError(
        f"{path} is neither a splitserve run directory ({ARCH_FILE}) nor a DSpark export (config.json)"
    )


def _meta(draft: str | Path | DraftMeta) -> DraftMeta:
    return draft if isinstance(draft, DraftMeta) else read_draft_meta(draft)


def load_draft(draft: str | Path | DraftMeta, target: TargetWeights,
               checkpoint: str | Path | None = None, share: bool = False) -> torch.nn.Module:
    """`draft`: its directory, or its DraftMeta when already read. `checkpoint`: a run's
    checkpoint directory to load instead of its latest. `share`: the frozen copies of the
    target's tensors become the target's own (share_target_weights) before the draft moves to the
    target's device, so they are never copied there. -> the family's model (DSparkDraft, ...)."""
    meta = _meta(draft)
    path = meta.path
    check_compatible(meta.arch, target.info, where=f"draft {path}")
    model = get_family(meta.family).model(meta.arch)
    if meta.kind == "run":
        ckpt = Path(checkpoint) if checkpoint is not None else latest_checkpoint(path)
        if ckpt is None:
            raise CheckpointError(f"run {path} has no checkpoint yet")
        model.load_shared(target.embed_weight(), target.lm_head_weight())
        load_weights(ckpt, model)
    else:
        file = path / "model.safetensors"
        try:
            weights = load_file(str(file))
        except Exception as exc:
            raise CheckpointError(f"{file} is unreadable (truncated or corrupt): {exc}") from exc
        state = {k.removeprefix("model."): v for k, v in weights.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{file} does not fit its config: missing={missing[:5]} unexpected={unexpected[:5]}")
    if share:
        share_target_weights(model, target, before_move=True)
    return model.to(device=target.device, dtype=target.dtype).eval()


@torch.no_grad()
def share_target_weights(draft: torch.nn.Module, target: TargetWeights, before_move: bool = False) -> int:
    """Point the draft's frozen copies of the target's embedding and lm_head (every family keeps
    some: DSpark's embed_tokens and lm_head or target_lm_head, EAGLE-3's and MTP's
    target_lm_head) at the target's own tensors, as a serving engine shares them: at the 8B shape
    each copy is 1.2 GB of GPU memory. Only a copy bit-equal to the target's tensor (same shape,
    dtype, device and values) is shared, so nothing the draft computes changes. Each shared
    parameter is a new Parameter over the target's storage: `.to()` on the draft then replaces
    the draft's, never the target's. Not for a draft that is saved afterwards (safetensors
    refuses tensors that share memory) or trained.
    `before_move`: the draft is about to be cast to the target's dtype and moved to its device
    (load_draft), so a copy on another device or in another dtype is compared as it will be,
    cast to the target's dtype, on its own device (the target's tensor copied there for the
    check): the device never holds the draft's copy. -> bytes freed (on the target's device)."""
    sources = {id(w): w for w in (target.embed_weight(), target.lm_head_weight())}.values()
    on_host: dict[tuple[int, torch.device], torch.Tensor] = {}  # before_move: each source copied once

    def there(w: torch.Tensor, device: torch.device) -> torch.Tensor:
        if (id(w), device) not in on_host:
            on_host[id(w), device] = w.to(device)
        return on_host[id(w), device]

    freed = 0
    for module in draft.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.requires_grad:
                continue
            for w in sources:
                if param.data_ptr() == w.data_ptr() or param.shape != w.shape:
                    continue
                if before_move:
                    same = torch.equal(param.to(w.dtype), there(w, param.device))
                else:
                    same = param.dtype == w.dtype and param.device == w.device and torch.equal(param, w)
                if same:
                    setattr(module, name, torch.nn.Parameter(w.detach(), requires_grad=False))
                    freed += w.numel() * w.element_size()
                    break
    return freed


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "bfloat16" if on_cuda else "float32"


DEFAULT_TARGET = "smollm2-135m"


def target_config_for(meta: DraftMeta, models: ModelsConfig) -> TargetConfig:
    """The target a draft runs against, with the draft's captured layers: `models.target` when
    given (named by its directory), else the run's own target (named as the draft was trained
    against it), else the embedded default."""
    if models.target:
        path, name = models.target, Path(models.target).name
    elif meta.target_path:
        path = meta.target_path
        name = meta.arch.target_name or Path(path).name
    else:  # an export names its target but not where it is: the embedded default, named as such
        path = name = DEFAULT_TARGET
    return TargetConfig(name=name, path=path, device=models.device, dtype=resolve_dtype(models.dtype, models.device),
                        layer_ids=list(meta.arch.target_layer_ids), revision=models.revision,
                        layer_rule="last" if getattr(meta.arch, "reads_last_layer", False) else "spread",
                        trust_remote_code=models.trust_remote_code)


def check_draft_layers(meta: DraftMeta) -> None:
    """Refuse, before any weight loads, a draft whose captured target layers repeat one (made by
    a default rule that a small target could not fit): no server captures a layer twice, and the
    target refuses such ids anyway. One line naming the draft, its ids and how to retrain it."""
    from splitserve.target.layers import max_default_layers, repeated

    ids = list(meta.arch.target_layer_ids)
    twice = repeated(ids)
    if not twice:
        return
    n = meta.arch.target_num_layers
    bound = f" with K <= {max_default_layers(n)} on its {n}-layer target" if n else ""
    raise UserError(f"draft {meta.path} captures target layers {ids}, repeating layer(s) {twice}; each captured "
                    f"layer must be distinct (a server captures each once): retrain it with "
                    f"target.num_capture_layers=K{bound}, or target.layer_ids=[...] with distinct ids")


def load_models(models: ModelsConfig, meta: DraftMeta | None = None, shared_weights_only: bool = False):
    """-> (target, the draft: its family's module), both on the target's device and dtype, in eval
    mode. The draft is checked against the target's config.json before any target weight is read.
    `meta`: the draft's metadata when the command has read it already. `shared_weights_only`: the
    target as its embedding and lm_head alone (SharedWeightsTarget; what an export needs), not the
    model."""
    from splitserve.target import hf, shared_weights

    meta = meta or read_draft_meta(models.draft)
    if not shared_weights_only and not get_family(meta.family).serves:  # an export drafts nothing
        raise UserError(f"draft {meta.path} is a draft.family={meta.family} draft: it trains and checkpoints, "
                        "but evaluation and serving do not draft with it yet")
    check_draft_layers(meta)
    tcfg = target_config_for(meta, models)
    if shared_weights_only:
        target = shared_weights.SharedWeightsTarget(tcfg)
    else:
        check_compatible(meta.arch, hf.peek_target_info(tcfg), where=f"draft {meta.path}")
        target = hf.load_hf_target(tcfg)
    draft = load_draft(meta, target, share=not shared_weights_only)
    # STS temperatures of the primary calibration fit (calibration.json of the run or export), for
    # confidence-scheduled verification; None: the engine uses the raw c_k.
    draft.confidence_temperatures = temperatures_for(load_calibration(meta.path))
    return target, draft
