"""Helpers for the catalogue of bad inputs, shared by tests/unit/test_bad_inputs.py, tests/unit/test_config.py and
tests/integration/test_bad_inputs_runs.py: a deadline for inputs that could block, FIFOs, a pickle payload that
proves whether a loader ran code, and the needles of a --resume that is not a checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) if the block takes longer than ``seconds``: for FIFO cases."""

    def expired(signum, frame):
        raise AssertionError(f"still blocked after {seconds} s: the input was opened and read")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


class Payload:
    """Unpickling this creates ``marker``: proof that a loader executed code from the file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def not_a_checkpoint_needles(target: Path) -> list[str]:
    return [f"--resume {str(target)!r}", "not a checkpoint folder (no progress.json)", "'auto'"]
