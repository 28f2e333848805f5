"""Typed dataclasses for every command: every default lives here, `conf/` YAML holds differences.

    run.py       RunConfig, the tree of `splitserve train | dump` (composed by Hydra from `conf/`)
    commands.py  the settings of serve, bench, eval, export, calibrate, report and gen; the CLI
                 builds each command's flags from their fields, so a default is written once
    compose.py   compose(overrides) -> RunConfig for scripts (Hydra, or plain Python without it);
                 from_dict reads a written config.yaml back
Library code receives these plain dataclasses, never a Hydra DictConfig; the CLI converts once at
the edge. Importing this package loads neither torch nor Hydra.
"""

from splitserve.config.commands import (  # noqa: F401
    BenchConfig,
    CalibrateCommand,
    EndpointConfig,
    EngineConfig,
    EvalCommand,
    ExportCommand,
    GenConfig,
    ModelsConfig,
    RemoteOptions,
    ReportCommand,
    ServerConfig,
)
from splitserve.config.compose import (  # noqa: F401
    replaced_choices,
    GROUPS,
    PACKAGE_CONF,
    compose,
    compose_hydra,
    compose_plain,
    conf_dir,
    from_dict,
    save_resolved,
)
from splitserve.config.run import (  # noqa: F401
    DECAY_BY_BLOCK,
    DECAY_LONG_BLOCK,
    DataConfig,
    DraftConfig,
    DumpConfig,
    EvalConfig,
    LossConfig,
    RunConfig,
    SplitConfig,
    TargetConfig,
    TrainConfig,
    decay_for,
)
