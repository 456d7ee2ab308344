"""Exceptions that carry an exit code and a message that says what to do.

Scripts catch :class:`AccelTrainError` at the top level (see ``accel_train.cli``),
print ``error: <message>`` on one line and exit with ``exit_code``. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

# torch's re-raise of an exception from a DataLoader worker or the pin-memory thread (``ExceptionWrapper.reraise``):
# ``Caught UserError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n...``
_BACKGROUND = re.compile(r"\ACaught (\w+) (in [^\n]*?)\.\nOriginal Traceback \(most recent call last\):\n")


def unwrap_background_error(message: str) -> str:
    """``message`` without torch's worker wrapping: the original exception's message, then where it happened.

    ``Caught UserError in DataLoader worker process 1.\\nOriginal Traceback ...\\naccel_train.errors.UserError:
    cannot decode image x.png: ...`` becomes ``cannot decode image x.png: ... (in DataLoader worker process 1)``.
    Any other message is returned as it is.
    """
    match = _BACKGROUND.match(message)
    if match is None:
        return message
    name, where = match.groups()
    body = message[match.end() :]
    # the exception's own line ("accel_train.errors.UserError: ...") is the last one naming its type
    lines = list(re.finditer(rf"^(?:[\w.]+\.)?{name}: ", body, re.M))
    text = " ".join(body[lines[-1].end() :].split()) if lines else ""
    return f"{text or name} ({where})"


class AccelTrainError(Exception):
    """Base class for errors that are reported without a traceback."""

    exit_code = 1

    def __init__(self, *args: object):
        # torch rebuilds an exception raised in a DataLoader worker as ``type(exc)(message + its traceback)``
        if len(args) == 1 and isinstance(args[0], str):
            args = (unwrap_background_error(args[0]),)
        super().__init__(*args)


class UserError(AccelTrainError):
    """A mistake the user can fix: a bad flag, a missing file, a wrong config."""

    exit_code = 2


class CheckpointError(UserError):
    """A checkpoint or weights file that cannot be used (corrupt, unsafe, mismatched)."""


class NonFiniteLossError(AccelTrainError):
    """Training produced NaN/Inf; the last good checkpoint is kept."""

    exit_code = 3


class PeerLostError(AccelTrainError):
    """Another process of a multi-process run died or lost its connection; the checkpoints saved so far are kept."""

    exit_code = 4


class LaunchError(UserError):
    """The launcher started a different topology than the config asked for."""


# What gloo, NCCL and the c10d store say when the process at the other end of a collective is gone.
PEER_LOST_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "failed to recv, got 0 bytes",
    "ncclRemoteError",
    "remote process exited",
)


def peer_lost(exc: BaseException | None, rank: int, world_size: int) -> PeerLostError | None:
    """A :class:`PeerLostError` when ``exc`` (or an exception it was raised from) is a collective's failure because
    another process of this ``world_size``-process run is gone; None for anything else (a bug keeps its traceback).
    """
    if world_size < 2:
        return None
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        sign = next((s for s in PEER_LOST_SIGNS if s in str(err)), None) if isinstance(err, RuntimeError) else None
        if sign:
            who = f"rank {1 - rank}" if world_size == 2 else f"one of its other {world_size - 1} processes"
            return PeerLostError(
                f"another process of this run ({who}) died or lost its connection ({sign}), so this one stopped "
                "too; the checkpoints saved so far are kept: fix what that process's own error line names, if it "
                "printed one (an unreadable input fails again), then run the same command with --resume auto"
            )
        err = err.__cause__ or err.__context__
    return None
