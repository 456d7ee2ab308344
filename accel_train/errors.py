"""Exceptions that carry an exit code and a message that says what to do.

Scripts catch :class:`AccelTrainError` at the top level (see ``accel_train.cli``),
print ``error: <message>`` on one line and exit with ``exit_code``. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class AccelTrainError(Exception):
    """Base class for errors that are reported without a traceback."""

    exit_code = 1


class UserError(AccelTrainError):
    """A mistake the user can fix: a bad flag, a missing file, a wrong config."""

    exit_code = 2


class CheckpointError(UserError):
    """A checkpoint or weights file that cannot be used (corrupt, unsafe, mismatched)."""


class NonFiniteLossError(AccelTrainError):
    """Training produced NaN/Inf; the last good checkpoint is kept."""

    exit_code = 3


class LaunchError(UserError):
    """The launcher started a different topology than the config asked for."""
