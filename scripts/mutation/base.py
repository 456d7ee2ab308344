"""What a mutant is: one small plausible bug in the code that carries a promise (``Mutant``, written with ``_m``),
and the promises every list must cover. The lists are ``mutants.py`` (``MUTANTS``) and ``data_mutants.py``."""

from __future__ import annotations

from dataclasses import dataclass

PACKAGE = "accel_train"
#: The promises every mutant list must cover (tests/unit/test_mutation_check.py checks each has a mutant).
PROMISES = (
    "unwrapping and export",
    "resume state",
    "data order",
    "global batch and accumulation",
    "distributed evaluation",
    "main-process writes",
    "run-folder replacement",
    "safe loading",
    "schedule",
    "clipping",
    "best and early stopping",
    "retention",
    "parity",
    "fine-tuning weights",
    "ONNX check",
    "tracker runs",
    "socket interface",
    "data you can trust",
    "your own data",
    "threads beside other work",
)


class CheckError(Exception):
    """The check cannot run or cannot be trusted (exit 2); the message is one line that says what to do."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``old`` (exactly once in ``file``, a path from the repository root) becomes ``new``.

    ``tests``: pytest arguments (node ids or files, cheapest first: ``-x`` stops at the first failure) that
    should fail. ``equivalent``: a non-empty argument that the mutant cannot change behaviour; it is then listed
    but not run.
    """

    name: str
    promise: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""


def _m(name: str, promise: str, file: str, old: str, new: str, *tests: str, equivalent: str = "") -> Mutant:
    return Mutant(name, promise, f"{PACKAGE}/{file}", old, new, tuple(tests), equivalent)
