"""The README's commands are the CLI's: every `splitserve ...` line in a shell block parses with
that command's own parser (or composes as Hydra overrides for train/dump), and every flag the CLI
table names is a shown flag of that command. A renamed or removed flag fails here, not for a reader."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

from splitserve import cli
from splitserve.config.compose import compose

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
HYDRA = ("train", "dump")


def shell_commands(text: str) -> list[str]:
    """`splitserve ...` lines of the ```bash blocks, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("splitserve "):
                out.append(line)
    return out


def table_rows(text: str) -> dict[str, str]:
    """The CLI table's first cells: command -> its synopsis."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `splitserve (\w+)[^`]*`", text, re.M)}


def shown_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


COMMANDS = shell_commands(README)


def test_the_readme_has_commands_to_check():
    assert len(COMMANDS) >= 8 and {"eval", "export", "serve", "bench", "train"} <= {c.split()[1] for c in COMMANDS}
    assert set(table_rows(README)) >= set(cli.PARSERS) - {"report"} | set(HYDRA)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_parses(command):
    _, name, *argv = shlex.split(command)
    if name in HYDRA:
        compose([a for a in argv if "=" in a and not a.startswith("dump.")])  # unknown keys raise
        return
    parser, _ = cli.PARSERS[name]()
    parser.parse_args(argv)


@pytest.mark.parametrize("name", sorted(set(table_rows(README)) - set(HYDRA)))
def test_cli_table_names_only_real_flags(name):
    synopsis = table_rows(README)[name]
    named = set(re.findall(r"(--[a-z][a-z0-9-]*)", synopsis))
    parser, _ = cli.PARSERS[name]()
    assert named, f"the README's {name} row names no flag"
    assert named <= shown_flags(parser), f"README {name} row: {sorted(named - shown_flags(parser))} are not flags of it"
