"""``--early-stop-patience N``: stop once N evaluations in a row have not improved eval accuracy (or the task's
``monitor``: :mod:`accel_train.tasks`).

An evaluation improves when its ``eval_accuracy`` beats the best so far by more than
``--early-stop-min-delta`` (a monitor where lower is better, such as ``eval_loss``: falls below it by
more). Only the evaluations during training count (epoch ends and
``--eval-every``), not the final one. The counter and the best value travel in checkpoints
(``progress.json``, ``state.extra["early_stop"]``), so a resumed run stops at the same step as an
uninterrupted one. The decision is made from the gathered figure, the same number on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from accel_train.errors import CheckpointError

KEY = "early_stop"


def improves(value: float, best: float | None, higher: bool, by: float = 0.0) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) by more than ``by``, in the monitor's direction: the one
    rule best/ (the trainer) and early stopping both follow. A value that is not finite (a metric undefined at
    an early evaluation: NaN) never does, so the best is always finite."""
    if not math.isfinite(value):
        return False
    return best is None or (value > best + by if higher else value < best - by)


@dataclass
class EarlyStopping:
    patience: int
    min_delta: float = 0.0
    key: str = "eval_accuracy"  # the eval figure followed (the task's monitor)
    higher: bool = True  # whether a larger value is better
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    last_step: int | None = None  # an --eval-every evaluation at an epoch's end is followed by the epoch's own

    def observe(self, value: float, step: int) -> str | None:
        """Count one evaluation (a second one at the same step does not count); returns why to stop now, or None."""
        if step == self.last_step:
            return self.reason()
        self.last_step = step
        if improves(value, self.best, self.higher, self.min_delta):
            self.best, self.best_step, self.bad_evals = value, step, 0
        else:
            self.bad_evals += 1
        return self.reason()

    def reason(self) -> str | None:
        """Why the run is over (a resumed run that had already stopped says so again), or None."""
        if self.bad_evals < self.patience:
            return None
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        return (
            f"early stopping: {self.key} did not improve{by} for {self.bad_evals} evaluations "
            f"(best {self.best:.4f} at step {self.best_step})"
        )

    def state(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_step": self.best_step,
            "bad_evals": self.bad_evals,
            "last_step": self.last_step,
        }

    def restore(self, saved: Any, where: str) -> None:
        """The counter saved in checkpoint ``where`` (None: the run had no early stopping then)."""
        if saved is None:
            return
        number = (int, float)
        valid = (
            isinstance(saved, dict)
            and isinstance(saved.get("bad_evals"), int)
            and saved["bad_evals"] >= 0
            and (saved.get("best") is None or isinstance(saved["best"], number))
            and all(saved.get(k) is None or isinstance(saved[k], int) for k in ("best_step", "last_step"))
        )
        if not valid:
            raise CheckpointError(
                f"cannot resume from {where}: its early-stopping state (state.extra.{KEY} in progress.json) is "
                "invalid; resume from another checkpoint, or start a new --output-dir"
            )
        self.best, self.best_step, self.bad_evals = saved.get("best"), saved.get("best_step"), saved["bad_evals"]
        self.last_step = saved.get("last_step")
