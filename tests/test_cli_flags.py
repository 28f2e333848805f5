"""Each command's flags are its config dataclasses' fields (splitserve/config/): a flag's
default is read from its field, never typed a second time, and the parsed flags build the
configs the command runs with."""

import dataclasses

import pytest

from splitserve import cli
from splitserve.config import EngineConfig, ModelsConfig, ServerConfig

REQUIRED = {"eval": ["--draft", "D"], "export": ["R", "O"], "gen": ["--out", "o.jsonl"], "calibrate": ["R"],
            "report": ["S"], "serve": ["--draft", "D"], "bench": ["--draft", "D"]}
NOT_FIELD_DEFAULTS = {("gen", "api_key"), ("gen", "urls")}  # $OPENAI_API_KEY; no --endpoint: in process


def test_every_argparse_command_is_covered():
    assert set(cli.PARSERS) == set(REQUIRED) == set(cli.COMMANDS)


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_every_flag_is_a_config_field(command):
    """No flag of its own: each is bound to a field, so its default cannot drift from it."""
    p, flags = cli.PARSERS[command]()
    dests = {a.dest for a in p._actions if a.dest != "help"}
    assert dests == set(flags.bound)
    for name, (cls, _) in flags.bound.items():
        assert name in {f.name for f in dataclasses.fields(cls)}, (cls, name)


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_flag_defaults_are_the_field_defaults(command, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p, flags = cli.PARSERS[command]()
    args = p.parse_args(REQUIRED[command])
    given = {a.dest for a in p._actions if a.required}  # on the command line
    for name, (cls, convert) in flags.bound.items():
        if name in given:
            continue
        value = getattr(args, name)
        value = convert(value) if convert is not None and value is not None else value
        if (command, name) not in NOT_FIELD_DEFAULTS:
            assert value == cli.field_default(cls, name), (command, cls.__name__, name)


def test_a_disagreeing_default_is_caught():
    """What the tests above guard against: a flag default typed again, and wrong."""
    import argparse

    flags = cli.Flags(argparse.ArgumentParser())
    flags.add(ServerConfig, "port", "--port", type=int, default=9000, help="TCP port")
    assert flags.build(ServerConfig, flags.parser.parse_args([])) != ServerConfig()


def test_serve_flags_build_the_configs():
    p, flags = cli.serve_parser()
    args = p.parse_args(["--draft", "D", "--no-cuda-graphs", "--compile", "--max-context", "512", "--seed", "3",
                         "--ignore-field", "a", "--ignore-field", "b", "--timeout-keep-alive", "2",
                         "--model-name", "m", "--trust-remote-code", "--no-markov-kernel", "--no-overlap"])
    assert flags.build(ModelsConfig, args) == ModelsConfig(draft="D", trust_remote_code=True)
    assert flags.build(EngineConfig, args) == EngineConfig(max_context=512, use_cuda_graphs=False,
                                                           compile_backend="inductor", seed=3, markov_kernel=False,
                                                           overlap_steps=False)
    assert flags.build(EngineConfig, p.parse_args(["--draft", "D"])).overlap_steps is None  # the device decides
    assert flags.build(ServerConfig, args) == ServerConfig(ignore_fields=("a", "b"), keep_alive_s=2.0,
                                                           served_model_name="m")
    assert cli.serve_parser()[0].parse_args(["--draft", "D"]).ignore_fields == []  # no list shared across parses


def test_chat_template_kwargs_must_be_a_json_object(capsys):
    p, _ = cli.eval_parser()
    assert p.parse_args(["--draft", "D", "--chat-template-kwargs", '{"a": 1}']).chat_template_kwargs == {"a": 1}
    for bad in ("{", "[1]"):
        with pytest.raises(SystemExit):
            p.parse_args(["--draft", "D", "--chat-template-kwargs", bad])
    assert "--chat-template-kwargs" in capsys.readouterr().err
