"""The CLI explains itself: every flag has help text and shows its default, earlier flag names
parse but stay out of --help, `train --help` lists every config group option with one line, the
README's option lists name exactly the options the package ships, and --version answers."""

import argparse
import re
from pathlib import Path

import pytest

from splitserve import __version__, cli
from splitserve.cli.train_help import groups, train_help

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = sorted(cli.PARSERS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_and_shows_its_default(command):
    p, _ = cli.PARSERS[command]()
    fmt = p._get_formatter()
    p.format_help()  # renders (and so checks) every help string
    for action in p._actions:
        if action.dest == "help" or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{command} {action.option_strings or action.dest}: no help text"
        shows = action.default not in (None, False, "", [], argparse.SUPPRESS) and action.option_strings \
            and not isinstance(action, (argparse._StoreTrueAction, argparse._StoreConstAction))
        if shows:  # the rendered help of that flag names its default
            assert "default" in fmt._expand_help(action), f"{command} {action.option_strings}: default not shown"


def test_a_flag_without_help_is_refused_when_bound():
    from splitserve.config import ServerConfig

    with pytest.raises(ValueError, match="--port: every flag needs help"):
        cli.Flags(argparse.ArgumentParser()).add(ServerConfig, "port", "--port", type=int)


def test_earlier_flag_names_parse_but_are_not_shown():
    from splitserve.config import EngineConfig

    p, _ = cli.serve_parser()
    text = p.format_help()
    assert "--max-context" not in text and "MAX_CONTEXT" not in text and "--model-name " not in text
    args = p.parse_args(["--draft", "D", "--max-context", "512", "--model-name", "m"])
    assert args.max_context == 512 and args.served_model_name == "m"
    assert p.parse_args(["--draft", "D"]).max_context == cli.field_default(EngineConfig, "max_context")


def test_version(capsys):
    cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"splitserve {__version__}"


@pytest.mark.parametrize("command", ["train", "dump"])
def test_train_help_lists_every_option_with_a_line(command, capsys):
    cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert "powered by Hydra" not in out and f"splitserve {command} --cfg job" in out
    for group, options in groups(cli.conf_dir()).items():
        assert f"  {group}:" in out
        for option, text in options:
            assert text, f"conf/{group}/{option}.yaml has no opening comment to describe it"
            assert re.search(rf"^ +\*?{re.escape(option)} +{re.escape(text)}$", out, re.M), (group, option)
    assert train_help(command, cli.conf_dir()) in out


def test_readme_option_lists_match_the_package():
    """Each `group=a|b|c` list in the README names exactly the options conf/<group>/ ships."""
    readme = (ROOT / "README.md").read_text()
    for group, options in groups(cli.conf_dir()).items():
        lists = re.findall(rf"`{group}=([\w|.-]+)`", readme)
        assert lists, f"README names no {group}= list"
        for found in lists:
            assert sorted(found.split("|")) == sorted(o for o, _ in options), (group, found)
