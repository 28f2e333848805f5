"""Composing a RunConfig from conf/ plus overrides, as `splitserve train OVERRIDES...` sees it: through
Hydra's compose API where Hydra is installed, else in plain Python (tests/test_compose.py holds the
two equal); and reading a written config.yaml back into its dataclasses (from_dict)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from splitserve.config.run import RunConfig

PACKAGE_CONF = Path(__file__).resolve().parents[1] / "conf"  # package data: ships in the wheel
GROUPS = ("target", "draft", "data", "loss", "split", "experiment")  # the conf/ groups


def save_resolved(cfg: RunConfig, run_dir: Path) -> None:
    """run_dir/config.yaml: the run's resolved settings, read back by from_dict."""
    from omegaconf import OmegaConf

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def conf_dir() -> Path:
    """The Hydra config tree: the package's own, or SPLITSERVE_CONF to use a copy of it."""
    env = os.environ.get("SPLITSERVE_CONF")
    path = Path(env) if env else PACKAGE_CONF
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"no Hydra config at {path} (SPLITSERVE_CONF must name a directory holding "
                                "config.yaml)")
    return path


def compose(overrides: list[str] | tuple[str, ...] = (), conf: str | Path | None = None) -> RunConfig:
    """The RunConfig `splitserve train OVERRIDES...` runs, e.g.
    compose(["draft=dspark_b16", "loss=paper", "train.lr=3e-4"]): Hydra's compose API where Hydra
    is installed, else the same composition in plain Python (compose_plain: for GPU hosts with only
    torch and transformers; tests/test_compose.py holds the two equal)."""
    conf = Path(conf) if conf is not None else conf_dir()
    try:
        import hydra  # noqa: F401
    except ImportError:
        cfg = compose_plain(list(overrides), conf)
    else:
        cfg = compose_hydra(list(overrides), conf)
    for message in replaced_choices(overrides, cfg):
        raise ValueError(message)
    return cfg


def replaced_choices(overrides, cfg) -> list[str]:
    """A `loss=OPTION` the user chose that a later group replaced (draft=eagle3 and draft=mtp set
    their own loss): one message each, for compose (ValueError) and the CLI (checks.py, UserError)
    to refuse, rather than train with another loss unsaid."""
    found = []
    for override in overrides:
        key, _, option = str(override).partition("=")
        if key == "loss" and option != cfg.loss.name:
            found.append(f"loss={option} is not applied: draft={cfg.draft.name} sets its own loss "
                         f"({cfg.loss.name}, kind {cfg.loss.kind}); drop loss={option}, and tune that loss "
                         "with loss.<key>=... instead")
    return found


def compose_hydra(overrides: list[str], conf: Path) -> RunConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="base_config", node=RunConfig)
    with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
        return OmegaConf.to_object(hydra_compose(config_name="config", overrides=overrides))


def compose_plain(overrides: list[str], conf: Path) -> RunConfig:
    """Hydra's composition of conf/, for the subset of it this tree uses: config.yaml's defaults
    list (a group option each, `_self_`, an optional experiment), group files merged into their
    group or, under `# @package _global_`, into the root, an experiment's own defaults list, and
    overrides `group=option`, `key=value` and `+key=value` (a new key of a dict field)."""
    import yaml

    choices, sets = {}, []
    for o in overrides:
        key, sep, text = o.partition("=")
        if not sep:
            raise ValueError(f"override {o!r} is not key=value")
        if key in GROUPS:
            choices[key] = text
        else:
            sets.append((key, text))
    tree = dataclasses.asdict(RunConfig())

    def load(group: str | None, name: str) -> None:
        path = conf / (f"{group}/{name}.yaml" if group else f"{name}.yaml")
        text = path.read_text()
        data = yaml.safe_load(text) or {}
        global_ = "@package _global_" in "".join(text.splitlines()[:1])
        entries = data.pop("defaults", None) or []
        data.pop("hydra", None)
        if "_self_" not in entries:
            entries = [*entries, "_self_"]
        for entry in entries:
            if entry == "_self_":
                _merge(tree if global_ or group is None else tree[group], data, f"{path}")
            elif isinstance(entry, str):  # "base_config" (the tree above), or an option of this file's group
                if group:
                    load(group, entry)
            else:
                (g, option), = entry.items()
                option = choices.get(g, option)
                if option not in (None, "null"):
                    load(g, option)

    for g in choices:
        if g not in GROUPS or not (conf / g / f"{choices[g]}.yaml").exists():
            raise ValueError(f"override {g}={choices[g]}: no such option in {conf / g}")
    load(None, "config")
    for key, text in sets:
        *parents, leaf = key.lstrip("+").split(".")
        node = tree
        for k in parents:
            node = node[k]
        if leaf not in node and not key.startswith("+"):
            raise KeyError(f"could not override {key!r}: no such key (to add one: +{key}={text})")
        node[leaf] = yaml.safe_load(text) if text else ""
    return from_dict(RunConfig, _interpolate(tree, tree))


def _merge(into: dict, data: dict, where: str) -> None:
    for k, v in data.items():
        if k not in into:
            raise KeyError(f"{where}: {k!r} is not a config key")
        if isinstance(v, dict) and isinstance(into[k], dict) and into[k] and k != "chat_template_kwargs":
            _merge(into[k], v, where)
        else:
            into[k] = v


def _interpolate(value, root: dict):
    """${a.b} references, as OmegaConf resolves them (run_dir: runs/${draft.name}-${target.name})."""
    import re

    if isinstance(value, dict):
        return {k: _interpolate(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, root) for v in value]
    if isinstance(value, str):
        def lookup(m):
            node = root
            for k in m.group(1).split("."):
                node = node[k]
            return str(node)

        return re.sub(r"\$\{([\w.]+)\}", lookup, value)
    return value


def from_dict(cls, data: dict):
    """A dict (e.g. a run's config.yaml, read with yaml.safe_load) -> the dataclass `cls`, nested
    dataclasses included; values are converted to the field types as OmegaConf does (YAML's "3e-3"
    is a string, a float field's value a float). An unknown key is a TypeError."""
    import typing

    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def _coerce(hint, value):
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _coerce(next(a for a in args if a is not type(None)), value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    if origin in (list, tuple):
        return origin(_coerce(args[0], v) for v in value) if value is not None else value
    if hint is bool and isinstance(value, str):
        return {"true": True, "false": False}[value.lower()]
    if hint in (int, float) and isinstance(value, (str, int)) and not isinstance(value, bool):
        return hint(value)
    if hint is str and isinstance(value, (int, float)):
        return str(value)
    return value
