"""Sweep reports: find the runs of a Hydra multirun, tabulate and plot them (`splitserve report`)."""

from splitserve.evaluation.report.runs import RunSummary, read_sweep
from splitserve.evaluation.report.write import write_report

__all__ = ["RunSummary", "read_sweep", "write_report"]
