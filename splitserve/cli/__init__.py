"""The `splitserve` console script. Entry points stay thin: parse, build, run, close.

    splitserve train  [hydra overrides]   distil a draft, then evaluate it on held-out prompts
    splitserve dump   [hydra overrides]   store the target's hidden states for offline training
    splitserve eval   --draft D [...]     speculative decoding against the real target
    splitserve export RUN_DIR OUT_DIR     Hugging Face (or --format speculators / sglang) checkpoint of a draft
    splitserve gen    --out FILE [...]    regenerate a prompt set's assistant turns with the target
    splitserve calibrate RUN_DIR          fit STS temperatures of the confidence head (calibration.json)
    splitserve report SWEEP_DIR           Markdown table and PNG plots over the runs of a sweep
    splitserve serve  --draft D [...]     OpenAI-compatible HTTP server (batch-1 speculative engine)
    splitserve bench  --draft D [...]     batch-1 latency and τ on random or chat prompts, optionally vs AR
    splitserve --version

`train` and `dump` are Hydra apps over the package's `splitserve/conf/` (so `-m` multirun
sweeps work; splitserve.config.compose gives the same RunConfig to scripts); the other commands
take plain flags, each bound to a field of their config dataclasses (Flags), defaults in
config.py. A user error (a bad file, row, flag, port or draft) prints one line and exits 1;
`--debug` anywhere on the line shows its traceback instead.
"""

from __future__ import annotations

import sys

from splitserve.checks import user_error_types
from splitserve.cli.evaluate import calibrate_main, calibrate_parser, eval_main, eval_parser, report_main, report_parser
from splitserve.cli.export import export_main, export_parser
from splitserve.cli.flags import Flags, field_default  # noqa: F401  (the flag binding, for tests and scripts)
from splitserve.cli.gen import gen_main, gen_parser
from splitserve.cli.hydra_app import conf_dir, hydra_app  # noqa: F401
from splitserve.cli.serve import bench_main, bench_parser, serve_main, serve_parser
from splitserve.config import PACKAGE_CONF  # noqa: F401  (tests read the package's conf/ through cli)

USAGE = __doc__.split("\n\n")[1]
DEBUG_FLAG = "--debug"

PARSERS = {"eval": eval_parser, "export": export_parser, "gen": gen_parser, "calibrate": calibrate_parser,
           "report": report_parser, "serve": serve_parser, "bench": bench_parser}
COMMANDS = {"eval": eval_main, "export": export_main, "gen": gen_main, "calibrate": calibrate_main,
            "report": report_main, "serve": serve_main, "bench": bench_main}  # train and dump go through Hydra


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage:\n" + USAGE)
        return
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(f"splitserve {version('splitserve')}")
        return
    cmd, rest = argv[0], argv[1:]
    if cmd in ("train", "dump") and any(a in ("-h", "--help") for a in rest):
        from splitserve.cli.train_help import train_help

        print(train_help(cmd, conf_dir()))
        return
    if cmd not in COMMANDS and cmd not in ("train", "dump"):
        sys.exit(f"splitserve: unknown command {cmd!r}\nusage:\n{USAGE}")
    try:
        if cmd in ("train", "dump"):
            hydra_app(cmd, rest)
        else:
            COMMANDS[cmd](rest)
    except user_error_types() as exc:
        if debug:
            raise
        from splitserve.errors import one_line

        sys.exit(f"splitserve {cmd}: {one_line(exc)}")
