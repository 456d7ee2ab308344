"""One-line checks of the JSON a run reads back (a checkpoint's ``progress.json``, an export's ``config.json``).

:class:`Checker` raises one :class:`CheckpointError` line that names the file, the field, the problem and what
to do. Used by ``checkpoint.metadata`` (the checkpoint's own fields) and ``config.check_saved_config`` (the run
config a checkpoint carries): light, so the config imports it without the checkpoint package.
"""

from __future__ import annotations

import math
from typing import Any

from accel_train.errors import CheckpointError
from accel_train.limits import MAX_INT


def shown(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Checker:
    """Raises one line naming ``where`` and the field; ``fix`` says what to do about it."""

    def __init__(self, where: str, fix: str):
        self.where, self.fix = where, fix

    def fail(self, field: str, problem: str) -> None:
        raise CheckpointError(f"{self.where}: {field} {problem}; {self.fix}")

    def integer(self, data: dict, key: str, low: int, high: int = MAX_INT, prefix: str = "") -> None:
        if key in data and not (is_int(data[key]) and low <= data[key] <= high):
            bounds = f">= {low}" if high == MAX_INT else f"between {low} and {high:,}"
            self.fail(prefix + key, f"must be an integer {bounds}, got {shown(data[key])}")

    def mapping(self, data: dict, key: str, optional: bool = True) -> dict:
        value = data.get(key)
        if (value is None and key in data and optional) or (key not in data and optional):
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"must be a JSON object, got {shown(value)}")
        return value
