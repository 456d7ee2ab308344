"""Where a command may write its output (eval's report and confusion PNG, predict's contact sheet, plot_runs'
chart, convert's export folder): checked before any work is done, in one line each.

Refused: an existing file without ``--overwrite``; a folder where a file is wanted (or a file where a folder is
wanted); a path under a file; a broken or looping symbolic link anywhere on the path; a place that cannot be
written (no permission, a read-only file system); a wrong extension; one of the command's own inputs (a file, or
anything inside an input folder); and anything that belongs to a run (a name of ``run_dir.OUTPUTS`` directly
inside a folder holding an accel_train run: its summary, weights, checkpoints, ...), even with ``--overwrite``.
A new file beside a run (``RUN/eval.json``) is fine. Links are followed: what is compared is where the path
really leads, and the writers write there (:func:`real_path`). Light: no torch.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from accel_train.errors import UserError
from accel_train.fsio import real_path
from accel_train.limits import file_kind
from accel_train.run_dir import MARKER, OUTPUTS

PathLike = str | os.PathLike


def check_output_file(
    path: PathLike,
    flag: str,
    *,
    suffixes: Sequence[str],
    overwrite: bool = False,
    inputs: Iterable[PathLike] = (),
    runs: Iterable[PathLike] = (),
) -> Path:
    """Refuse ``path`` as ``flag``'s output file (see the module docstring); returns where it really leads.

    ``inputs``: files and folders the command reads (nothing is written onto or inside them); ``runs``: folders
    treated as runs even without the marker (plot_runs' RUN_DIRs: their own files, not new files beside them).
    """
    real = real_path(path, flag)
    _refuse_inputs(real, flag, path, inputs, writes_into=False)
    _refuse_run_files(real, flag, path, runs, suffixes[0])
    if real.exists():
        mode = os.stat(real).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(
                f"{flag} {path} is {file_kind(mode)}, not a file; give a file name, e.g. "
                f"{flag} {Path(path) / ('out' + suffixes[0])}"
            )
    if real.suffix.lower() not in suffixes or Path(path).suffix.lower() not in suffixes:
        accepted = " or ".join(suffixes)
        raise UserError(f"{flag} {path}: the file name must end in {accepted}; e.g. {flag} report{suffixes[0]}")
    if real.exists() and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it, or choose another path")
    _check_writable(real, flag, path)
    return real


def check_output_folder(
    path: PathLike, flag: str, *, inputs: Iterable[PathLike] = (), writes: Sequence[str] = ()
) -> Path:  # fmt: skip
    """``flag``'s output folder: not a file, not under a file, writable, not (inside) an input, not a run's own
    folder; ``writes``: the names written inside it, none of which may be an input. Returns where it leads."""
    real = real_path(path, flag)
    if real.exists() and not real.is_dir():
        what = "a file" if real.is_file() else file_kind(os.stat(real).st_mode)
        raise UserError(f"{flag} {path} is {what}, not a folder; choose a folder for the output")
    inputs = list(inputs)
    _refuse_inputs(real, flag, path, inputs, writes_into=False)
    for name in writes:
        _refuse_inputs(real / name, flag, path, inputs, writes_into=True)
    _refuse_run_files(real, flag, path, (), "")
    _check_writable(real, flag, path)
    return real


def weights_inputs(weights: PathLike) -> list[PathLike]:
    """What reading ``--weights`` reads: the file or folder, and beside a weights file its folder's
    ``config.json`` / ``progress.json`` (the model's description)."""
    parent = Path(weights).expanduser().parent
    return [weights, parent / "config.json", parent / "progress.json"] if Path(weights).is_file() else [weights]


def _resolved(given: PathLike) -> Path | None:
    try:
        return Path(given).expanduser().absolute().resolve()
    except (OSError, RuntimeError):
        return None


def _refuse_inputs(target: Path, flag: str, shown: PathLike, inputs: Iterable[PathLike], writes_into: bool) -> None:
    """``target`` (the output, or with ``writes_into`` a file written inside the output folder) is not one of
    ``inputs`` and not inside an input folder."""
    for given in inputs:
        source = _resolved(given)
        if source is None or not (target == source or (source.is_dir() and source in target.parents)):
            continue
        if writes_into:
            raise UserError(
                f"{flag} {shown}: writing {target.name} there would overwrite this command's input {given}; choose "
                "another folder"
            )
        what = "is" if target == source else "is inside"
        raise UserError(
            f"{flag} {shown} {what} this command's input {given}, which must not change; choose another path"
        )


def _refuse_run_files(real: Path, flag: str, shown: PathLike, runs: Iterable[PathLike], suffix: str) -> None:
    """``real`` is, or is inside, one of a run's own files (``run_dir.OUTPUTS``): refused even with --overwrite."""
    given = {r for r in map(_resolved, runs) if r is not None}
    for folder in real.parents:
        if folder in given or (folder / MARKER).is_file():
            first = real.relative_to(folder).parts[0]
            if first in OUTPUTS:
                beside = folder / f"my-{real.stem}{suffix}"
                raise UserError(
                    f"{flag} {shown} is one of the files of the run in {folder} ({first} belongs to that run and "
                    f"would be replaced, --overwrite or not); write beside it instead, e.g. {beside}"
                )


def _check_writable(real: Path, flag: str, shown: PathLike) -> None:
    """The nearest existing folder of ``real`` is a folder, writable, and not on a read-only file system."""
    parent = next(p for p in real.parents if os.path.lexists(p))
    if not parent.is_dir():
        raise UserError(f"{flag} {shown} is inside {parent}, which is a file, not a folder; choose another path")
    read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    if read_only or not os.access(parent, os.W_OK | os.X_OK):
        why = "a read-only file system" if read_only else "no write permission"
        raise UserError(
            f"{flag} {shown} cannot be written ({why} at {parent}); choose a writable place, or make {parent} writable"
        )
