"""``accel_train/errors.py``: the errors a user can fix are one family (exit code 2)."""

from __future__ import annotations

from accel_train.errors import CheckpointError, UserError


def test_user_errors_are_one_family():
    """Everything above is a UserError (exit 2): CheckpointError included."""
    assert issubclass(CheckpointError, UserError) and UserError.exit_code == 2
