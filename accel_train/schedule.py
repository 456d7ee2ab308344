"""The LR schedule as a pure function of the optimizer step.

It is stepped once per real optimizer step (never through accelerate's
prepared scheduler, which steps ``num_processes`` times per call), so the
same global batch gives the same LR at every step on any number of processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The ``step`` schedule's defaults (d2l-style): x0.1 at 50% and at 75% of training.
DEFAULT_MILESTONES = (0.5, 0.75)
DEFAULT_GAMMA = 0.1


def parse_milestones(text: str) -> tuple[float, ...]:
    """``"0.5,0.75"`` -> ``(0.5, 0.75)``: fractions of training, each in (0, 1), increasing.

    Raises ``ValueError`` saying what is wrong (the config turns it into a one-line error).
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError("needs at least one fraction of training")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError("must be comma-separated numbers") from None
    if not all(math.isfinite(v) and 0 < v < 1 for v in values):
        raise ValueError("each milestone must be a fraction of training between 0 and 1 (exclusive)")
    if any(b <= a for a, b in zip(values[:-1], values[1:], strict=True)):
        raise ValueError("milestones must increase")
    return values


def lr_factor(
    step: int,
    total_steps: int,
    schedule: str = "cosine",
    warmup_steps: int = 0,
    milestones: Sequence[float] = DEFAULT_MILESTONES,
    gamma: float = DEFAULT_GAMMA,
    warmup_from: float = 0.0,
) -> float:
    """Multiplier of the peak LR after ``step`` optimizer steps.

    Warm-up rises linearly from ``warmup_from`` to 1 over ``warmup_steps`` (airbench's triangle: 0.2, then
    ``linear`` down to 0). ``step``: multiplied by ``gamma`` at each of ``milestones`` (fractions of the
    steps after warm-up).
    """
    if warmup_steps and step < warmup_steps:
        return warmup_from + (1.0 - warmup_from) * (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "step":
        return gamma ** sum(progress >= m for m in milestones)
    raise ValueError(f"unknown schedule {schedule!r}")


class ScheduleFn:
    """Picklable callable for ``LambdaLR`` (its state_dict keeps no code).

    ``LambdaLR.state_dict`` saves this object's ``__dict__`` (as JSON in checkpoints) and
    ``load_state_dict`` updates it: keep the attribute names. A checkpoint from before
    ``milestones``/``gamma``/``warmup_from`` existed leaves the values this object was built with.
    """

    def __init__(
        self,
        total_steps: int,
        schedule: str,
        warmup_steps: int,
        milestones: Sequence[float] = DEFAULT_MILESTONES,
        gamma: float = DEFAULT_GAMMA,
        warmup_from: float = 0.0,
    ):
        self.total_steps, self.schedule, self.warmup_steps = total_steps, schedule, warmup_steps
        self.milestones, self.gamma = [float(m) for m in milestones], float(gamma)  # a list: JSON round-trips it
        self.warmup_from = float(warmup_from)

    def __call__(self, step: int) -> float:
        args = (self.milestones, self.gamma, self.warmup_from)
        return lr_factor(step, self.total_steps, self.schedule, self.warmup_steps, *args)
