"""The training progress bar: it counts what will end the run.

With a time budget (train.max_minutes) a run usually stops on time, long before train.max_steps,
so the bar counts minutes against the budget and shows the step beside it; without one it counts
steps. Either way the postfix shows the loss and `accept`, the draft's teacher-forced per-token
acceptance rate on the training batch (the metrics' `alpha`).
"""

from __future__ import annotations

import math

from tqdm import tqdm


class ProgressBar:
    def __init__(self, max_steps: int, step: int, budget_s: float, elapsed_s: float, disable: bool = False):
        self.timed = math.isfinite(budget_s)
        self.max_steps, self.step = max_steps, step
        self.start_elapsed = elapsed_s  # a resumed run's budget counts from its own start
        if self.timed:
            minutes = budget_s / 60
            self.bar = tqdm(total=round(minutes, 2), initial=0.0, unit="min", disable=disable,
                            desc=f"train ({minutes:g} min budget, train.max_minutes)",
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:g} min{postfix}")
        else:
            self.bar = tqdm(total=max_steps, initial=step, desc="train", unit="step", disable=disable)
        self._postfix: dict[str, str] = {}
        self._refresh()

    def advance(self, step: int, elapsed_s: float) -> None:
        """After a step: the step count, and the run's elapsed seconds (the budget's clock)."""
        if self.timed:
            used = round(min((elapsed_s - self.start_elapsed) / 60, self.bar.total), 2)
            self.bar.update(used - self.bar.n)
        else:
            self.bar.update(step - self.step)
        self.step = step
        self._refresh()

    def show(self, loss: float, accept: float) -> None:
        self._postfix.update(loss=f"{loss:.3f}", accept=f"{accept:.3f}")
        self._refresh()

    def _refresh(self) -> None:
        shown = {"step": f"{self.step}/{self.max_steps}"} if self.timed else {}
        self.bar.set_postfix({**shown, **self._postfix})

    def close(self) -> None:
        self.bar.close()
