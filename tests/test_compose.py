"""splitserve.config.compose: the RunConfig `splitserve train OVERRIDES` runs, from Hydra's
compose API or, where Hydra is not installed, from compose_plain; the two agree on every option
of every conf/ group and on the override forms the bench scripts use."""

import pytest

from splitserve.config import GROUPS, PACKAGE_CONF, RunConfig, compose, compose_hydra, compose_plain

pytest.importorskip("hydra")

OPTIONS = [f"{g}={p.stem}" for g in GROUPS for p in sorted((PACKAGE_CONF / g).glob("*.yaml"))]
OVERRIDES = [
    [],
    ["draft=dspark_b16", "loss=paper", "train.lr=3e-4"],
    ["experiment=quickstart", "draft=dflash_b16", "loss=dflash_ce", "draft.num_layers=4", "train.max_minutes=6.5"],
    ["experiment=ablate_block", "draft.markov_rank=64", "eval.extra_temperatures=[1.0]",
     "eval.prompt_sets=[humaneval,mtbench]", "target.capture_graphs=true", "train.keep_checkpoints=0"],
    ["+data.chat_template_kwargs.enable_thinking=false", "target.layer_ids=[1,2]", "train.max_minutes=null",
     "data.train_path=/tmp/x.jsonl", "run_dir=/tmp/run", "train.precision=bf16", "target.dtype=bfloat16"],
]


def test_every_group_option_is_tested():
    assert len(OPTIONS) >= 20 and {o.split("=")[0] for o in OPTIONS} == set(GROUPS)


@pytest.mark.parametrize("overrides", [[o] for o in OPTIONS] + OVERRIDES, ids=str)
def test_plain_composition_is_hydras(overrides):
    hydra_cfg = compose_hydra(overrides, PACKAGE_CONF)
    plain_cfg = compose_plain(overrides, PACKAGE_CONF)
    assert isinstance(plain_cfg, RunConfig)
    assert repr(plain_cfg) == repr(hydra_cfg)  # repr: 3e-4 and 0.0003, 1 and 1.0 differ in type too


def test_compose_reads_the_yaml_and_the_overrides():
    cfg = compose(["draft=dspark_b16", "loss=prefix", "train.lr=3e-4"])
    assert (cfg.draft.name, cfg.draft.block_size, cfg.loss.weighting, cfg.train.lr) == ("dspark_b16", 16,
                                                                                        "survival", 3e-4)
    assert cfg.run_dir == "runs/dspark_b16-smollm2-135m"


@pytest.mark.parametrize("bad", [["draft=nope"], ["train.nope=1"], ["nokey"]])
def test_plain_composition_refuses_what_hydra_refuses(bad):
    with pytest.raises(Exception):
        compose_hydra(bad, PACKAGE_CONF)
    with pytest.raises((ValueError, KeyError)):
        compose_plain(bad, PACKAGE_CONF)


def test_compose_without_hydra_takes_the_plain_path(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "hydra", None)  # import hydra now raises ImportError
    assert compose(["experiment=quickstart", "draft=dspark_b16"]) == compose_plain(
        ["experiment=quickstart", "draft=dspark_b16"], PACKAGE_CONF)


def test_a_written_config_reads_back():
    """from_dict: a config.yaml written with yaml.safe_dump (bench/ablation_gpu.py) -> the same RunConfig."""
    import dataclasses

    import yaml

    from splitserve.config import from_dict

    cfg = compose(["experiment=ablate_block", "+data.chat_template_kwargs.enable_thinking=false", "train.lr=3e-4"])
    assert from_dict(RunConfig, yaml.safe_load(yaml.safe_dump(dataclasses.asdict(cfg)))) == cfg


@pytest.mark.parametrize("path", ["hydra", "plain"])
def test_a_loss_choice_the_draft_replaces_is_refused(path, monkeypatch):
    """draft=eagle3 sets its own loss (conf/draft/eagle3.yaml): loss=paper beside it would be
    silently dropped, so it is refused naming both (the CLI: one line, below); the loss's own keys
    still apply."""
    if path == "plain":
        monkeypatch.setitem(__import__("sys").modules, "hydra", None)  # `import hydra` fails: the plain path
    with pytest.raises(ValueError, match=r"^loss=paper is not applied: draft=eagle3 sets its own loss \(ttt"):
        compose(["draft=eagle3", "loss=paper"])
    assert compose(["draft=eagle3", "loss.kl_weight=0.5"]).loss.kl_weight == 0.5
    assert compose(["draft=dspark_b8", "loss=paper"]).loss.name == "paper"


def test_the_train_cli_refuses_it_in_one_line():
    from splitserve import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "draft=eagle3", "loss=prefix", "train.max_steps=1"])
    assert exit_.value.code == ("splitserve train: loss=prefix is not applied: draft=eagle3 sets its own loss (ttt, "
                                "kind ttt); drop loss=prefix, and tune that loss with loss.<key>=... instead")
