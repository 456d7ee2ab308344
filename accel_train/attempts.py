"""A run's attempts: the steps and wall time of this one, and the run's wall time over all of them.

Every checkpoint carries, in ``progress.json``'s ``state.extra``, the run's wall time up to that save (each attempt
from the start of ``fit``: data and model included) as ``wall_time_s`` and the attempts that made it as
``attempts``; a resume goes on from them. What an attempt did after its last checkpoint (a kill) is not in them:
that work is done again, and counted then. A checkpoint written before they were kept leaves the earlier attempts'
time unknown: the summary says so (``null``) rather than counting this attempt's as the run's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Attempts:
    """This attempt's start, and what the checkpoint it resumed from says of the attempts before it."""

    first_step: int = 0  # the step this attempt started from
    earlier_s: float | None = 0.0  # the earlier attempts' wall time, to the checkpoint resumed; None: not recorded
    earlier: int | None = 0  # how many attempts those were; None: not recorded
    started: float = field(default_factory=time.perf_counter)  # this attempt's start (``fit``'s ``t_launch``)

    @classmethod
    def resumed(cls, extra: dict[str, Any], step: int) -> Attempts:
        """The attempts before a resume from a checkpoint at ``step`` with this ``state.extra``."""
        seconds, count = extra.get("wall_time_s"), extra.get("attempts")
        if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < math.inf):
            return cls(step, None, None)  # an older checkpoint (or a damaged value): the time is not known
        known = isinstance(count, int) and not isinstance(count, bool) and count >= 1
        return cls(step, float(seconds), count) if known else cls(step, None, None)

    def total_s(self, this_s: float) -> float | None:
        return None if self.earlier_s is None else self.earlier_s + this_s

    def record(self) -> dict[str, Any]:
        """For a checkpoint's ``state.extra``: the run's wall time to now and the attempts so far, this one counted."""
        count = None if self.earlier is None else self.earlier + 1
        return {"wall_time_s": self.total_s(time.perf_counter() - self.started), "attempts": count}

    def summary(self, step: int, this_s: float) -> dict[str, Any]:
        """summary.json's fields beside ``wall_time_s`` (this attempt's ``this_s``), at the run's ``step``."""
        count = None if self.earlier is None else self.earlier + 1
        return {"attempts": count, "attempt_steps": step - self.first_step, "total_wall_time_s": self.total_s(this_s)}

    def line(self, step: int, this_s: float) -> str:
        """``2000 steps in 119.2s``; after a resume ``2000 steps (600 in this attempt, 45.1s; 119.2s over 2
        attempts)``: the steps are the run's, the time each attempt's."""
        if self.earlier == 0:
            return f"{step} steps in {this_s:.1f}s"
        mine = f"{step - self.first_step} in this attempt, {this_s:.1f}s"
        if self.earlier_s is None:
            return f"{step} steps ({mine}; earlier attempts' time not recorded)"
        return f"{step} steps ({mine}; {self.total_s(this_s):.1f}s over {self.earlier + 1} attempts)"
