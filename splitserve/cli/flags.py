"""Flags bound to config dataclass fields: each default is written once, in splitserve/config/."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's defaults formatter, minus the noise: a flag's help ends with "(default: X)"
    unless it already names its default or has none worth showing (None, False, a flag that only
    switches something on)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default in (None, False, argparse.SUPPRESS)
                or isinstance(action, (argparse._StoreTrueAction, argparse._StoreConstAction))
                or (not action.option_strings and action.nargs is None)):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        if shown == "" or shown == []:
            return text
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command's parser: every flag's help shows its default (HelpFormatter)."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


class Flags:
    """argparse flags bound to config dataclass fields (splitserve/config/): a flag's default
    is its field's, so each default is written once, and `build` turns the parsed namespace back
    into the dataclass. Every flag of a command but --help is bound (tests/test_cli_flags.py)."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.bound: dict[str, tuple[type, Callable | None]] = {}  # dest (the field's name) -> (class, convert)

    def add(self, cls: type, name: str, *flags: str, group=None, convert: Callable | None = None, **kw) -> None:
        """Field `cls.name` as `flags` (none: a positional argument named as the field). `kw` as
        argparse's, `help` required; a `default` given here is one no field holds (e.g. from the
        environment)."""
        if name in self.bound and self.bound[name][0] is not cls:
            raise ValueError(f"{name} is bound to {self.bound[name][0].__name__} already")
        if not kw.get("help"):
            raise ValueError(f"{'/'.join(flags) or name}: every flag needs help text")
        where = group or self.parser
        self.bound[name] = (cls, convert)
        if not flags:
            where.add_argument(name, **kw)
            return
        if "default" not in kw and not kw.get("required"):
            default = field_default(cls, name)
            kw["default"] = list(default) if kw.get("action") == "append" and default is not None else default
        where.add_argument(*flags, dest=name, **kw)

    def alias(self, name: str, *old: str, group=None) -> None:
        """Earlier names of a bound flag: still parsed, never shown in --help."""
        action = next(a for a in self.parser._actions if a.dest == name)
        (group or self.parser).add_argument(*old, dest=name, type=action.type, default=argparse.SUPPRESS,
                                            help=argparse.SUPPRESS)

    def build(self, cls: type, args: argparse.Namespace, **given):
        """The `cls` its flags describe; `given`: fields with no flag of their own."""
        values = {}
        for name, (c, convert) in self.bound.items():
            if c is cls:
                value = getattr(args, name)
                values[name] = convert(value) if convert is not None and value is not None else value
        return cls(**values, **given)

    def hub(self) -> None:
        """--revision / --trust-remote-code for every command that loads the target (train and
        dump take them as target.revision / target.trust_remote_code)."""
        from splitserve.config import ModelsConfig

        self.add(ModelsConfig, "revision", "--revision",
                 help="a branch, tag or commit of a hub target (from_pretrained)")
        self.add(ModelsConfig, "trust_remote_code", "--trust-remote-code", action="store_true",
                 help="run the target's own modelling code from its directory (from_pretrained)")


def field_default(cls: type, name: str):
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default: bind it with required=True or a default")


def json_object(text: str) -> dict:
    """argparse type of --chat-template-kwargs: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value
