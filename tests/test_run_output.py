"""What a training run tells its user: the bar counts the time budget when there is one, the run
says why it stopped, and the closing block names the run's files, explains the table and gives
next commands that the CLI accepts as written."""

import shlex

import pytest

from splitserve import cli
from splitserve.config import RunConfig
from splitserve.evaluation.closing import closing_block
from splitserve.train.progress import ProgressBar


def test_a_timed_bar_counts_minutes_and_shows_the_step(capsys):
    bar = ProgressBar(max_steps=400, step=0, budget_s=360.0, elapsed_s=0.0)
    bar.advance(1, 3.0)
    bar.show(loss=1.5, accept=0.25)
    bar.advance(2, 6.0)
    assert bar.bar.total == 6.0 and abs(bar.bar.n - 0.1) < 1e-9
    text = str(bar.bar)
    assert "6 min budget" in text and "step=2/400" in text and "accept=0.250" in text
    bar.close()


def test_an_untimed_bar_counts_steps():
    bar = ProgressBar(max_steps=50, step=10, budget_s=float("inf"), elapsed_s=0.0)
    bar.advance(11, 1.0)
    assert bar.bar.total == 50 and bar.bar.n == 11
    bar.close()


@pytest.mark.parametrize("calibrated", [True, False])
def test_closing_block_names_the_files_and_commands_the_cli_takes(calibrated):
    cfg = RunConfig(run_dir="runs/quickstart")
    text = closing_block(cfg, gamma=8, calibrated=calibrated)
    assert "runs/quickstart/checkpoints/" in text and "γ = 8" in text
    for word in ("τ (tau)", "a1..aγ", "exact"):
        assert word in text
    assert ("STS" in text) == calibrated
    commands = [line.split("#")[0].strip() for line in text.splitlines() if line.strip().startswith("splitserve ")]
    assert [c.split()[1] for c in commands] == ["eval", "export", "serve"]
    for command in commands:  # each parses as written: a renamed flag would fail here
        _, name, *argv = shlex.split(command)
        parser, _ = cli.PARSERS[name]()
        parser.parse_args(argv)
