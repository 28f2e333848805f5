"""`splitserve train | dump`: Hydra apps over the package's conf/ (so `-m` multirun sweeps work);
the RunConfig is converted from Hydra's DictConfig once, here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from splitserve.checks import (check_draft_target, check_group_choices, check_run_config, check_target_layers,
                               check_train_data, user_error_types)
from splitserve.config import conf_dir as config_conf_dir
from splitserve.config import save_resolved


def conf_dir() -> Path:
    """config.conf_dir (the package's conf/, or SPLITSERVE_CONF), its error as the exit line."""
    try:
        return config_conf_dir()
    except FileNotFoundError as exc:
        sys.exit(f"splitserve: {exc}")


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from splitserve.config import RunConfig

    ConfigStore.instance().store(name="base_config", node=RunConfig)


def to_run_config(dcfg):
    """DictConfig -> RunConfig, once, at the edge; multirun jobs write into Hydra's job dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(dcfg)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        cfg.run_dir = hc.runtime.output_dir
    return cfg


def hydra_app(command: str, argv: list[str]) -> None:
    import hydra

    _register_schema()
    failed: list[BaseException] = []  # raised again after Hydra returns, so it never prints them

    @hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
    def app(dcfg) -> None:
        try:
            run(dcfg)
        except user_error_types() as exc:
            failed.append(exc)

    def run(dcfg) -> None:
        from hydra.core.hydra_config import HydraConfig

        cfg = to_run_config(dcfg)
        check_group_choices(HydraConfig.get().overrides.task, cfg)
        check_run_config(cfg)
        # The target's config.json is read after the cheaper checks (a data file's rows for train)
        # and before any rank, data loader or weight starts.
        if command == "train" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from splitserve.split.runner import run_split

            check_target_layers(cfg.target)
            if os.environ.get("RANK") == "0":
                save_resolved(cfg, Path(cfg.run_dir))
            run_split(cfg)  # a torchrun job split into target and draft ranks
        elif command == "train":
            from splitserve.evaluation.heldout import evaluate_run
            from splitserve.target import DECODING_BACKENDS
            from splitserve.train.loop import train

            check_train_data(cfg)
            check_target_layers(cfg.target)
            check_draft_target(cfg)
            result = train(cfg)  # writes config.yaml once the run directory is known to take it
            if cfg.eval.enabled and cfg.target.backend not in DECODING_BACKENDS:
                # Held-out evaluation decodes, which only the transformers backend does.
                print(f"[train] held-out evaluation skipped (target.backend={cfg.target.backend} only captures); "
                      f"run: splitserve eval --draft {cfg.run_dir}")
            elif cfg.eval.enabled:
                evaluate_run(cfg, result.target, result.draft)
        else:
            from splitserve.stream.dump_capture import run_dump

            check_target_layers(cfg.target)
            save_resolved(cfg, Path(cfg.dump.out_dir))
            run_dump(cfg)

    sys.argv = [f"splitserve {command}", *argv]
    app()
    if failed:
        raise failed[0]
