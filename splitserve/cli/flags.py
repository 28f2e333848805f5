"""Flags bound to config dataclass fields: each default is written once, in splitserve/config/."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable


class Flags:
    """argparse flags bound to config dataclass fields (splitserve/config/): a flag's default
    is its field's, so each default is written once, and `build` turns the parsed namespace back
    into the dataclass. Every flag of a command but --help is bound (tests/test_cli_flags.py)."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.bound: dict[str, tuple[type, Callable | None]] = {}  # dest (the field's name) -> (class, convert)

    def add(self, cls: type, name: str, *flags: str, group=None, convert: Callable | None = None, **kw) -> None:
        """Field `cls.name` as `flags` (none: a positional argument named as the field). `kw` as
        argparse's; a `default` given here is one no field holds (e.g. from the environment)."""
        if name in self.bound and self.bound[name][0] is not cls:
            raise ValueError(f"{name} is bound to {self.bound[name][0].__name__} already")
        where = group or self.parser
        self.bound[name] = (cls, convert)
        if not flags:
            where.add_argument(name, **kw)
            return
        if "default" not in kw and not kw.get("required"):
            default = field_default(cls, name)
            kw["default"] = list(default) if kw.get("action") == "append" and default is not None else default
        where.add_argument(*flags, dest=name, **kw)

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
