"""What every input layer shares (flags, YAML, an export's config.json, progress.json, images, weights).

Bounds on sizes and numbers: values beyond them are refused up front with one line instead of ending in an
allocation failure, an overflow or a crash deep inside torch. And the rule for opening an input file: only
regular files (:func:`check_regular_file`). Light: no torch.
"""

from __future__ import annotations

import os
import stat

from accel_train.errors import UserError

MAX_IMAGE_SIZE = 4096  # pixels per side after resizing (the models here train on 8..224)
MAX_CLASSES = 100_000
MAX_CHANNELS = 64
MAX_MODEL_PARAMS = 1 << 30  # parameters + buffers of a built model (4 GiB in fp32)
MAX_INT = (1 << 63) - 1  # what torch and numpy hold in an int64
SEED_LIMIT = 1 << 32  # numpy's seeds (accelerate's set_seed seeds numpy too) are 0 .. 2**32 - 1
MAX_DIST_TIMEOUT = 365 * 24 * 3600.0  # seconds; datetime.timedelta and torch hold much more, no one waits longer
MAX_SYNTHETIC_BYTES = 16 << 30  # the synthetic dataset is held in memory as uint8


def check_regular_file(path: str | os.PathLike, what: str, error: type[UserError] = UserError) -> None:
    """Only regular files are opened as inputs: a FIFO would block the reader forever, a device never ends.

    A path that does not exist passes (the caller's own open reports it); anything else that is not a
    regular file (after following links) is a one-line ``error`` (a UserError) naming what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISREG(mode):
        return
    raise error(f"{path} is {file_kind(mode)}, not a regular file; pass the {what} file itself")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file is, in words."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a device or other special file")
