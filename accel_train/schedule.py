"""The LR schedule as a pure function of the optimizer step.

It is stepped once per real optimizer step (never through accelerate's
prepared scheduler, which steps ``num_processes`` times per call), so the
same global batch gives the same LR at every step on any number of processes.
"""

from __future__ import annotations

import math


def lr_factor(step: int, total_steps: int, schedule: str = "cosine", warmup_steps: int = 0) -> float:
    """Multiplier of the peak LR after ``step`` optimizer steps."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "step":  # d2l-style: x0.1 at 50% and 75% of training
        return 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
    raise ValueError(f"unknown schedule {schedule!r}")


class ScheduleFn:
    """Picklable callable for ``LambdaLR`` (its state_dict keeps no code)."""

    def __init__(self, total_steps: int, schedule: str, warmup_steps: int):
        self.total_steps, self.schedule, self.warmup_steps = total_steps, schedule, warmup_steps

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.total_steps, self.schedule, self.warmup_steps)
