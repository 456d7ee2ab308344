"""Where a command may write its output (eval's report and confusion PNG, predict's contact sheet, plot_runs'
chart, convert's export folder): checked before any work is done, in one line each.

Refused: an existing file without ``--overwrite``; a folder where a file is wanted (or a file where a folder is
wanted); a path under a file; a broken or looping link; a place that cannot be written (no permission, a
read-only file system); a wrong extension; one of the command's own inputs; and anything that belongs to a run
(``run_dir.OUTPUTS`` inside a folder holding an accel_train run: its summary, weights, checkpoints, ...). A new
file beside a run (``RUN/eval.json``) is fine. Light: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from accel_train.errors import UserError
from accel_train.limits import file_kind
from accel_train.run_dir import MARKER, OUTPUTS


def check_output_file(
    path: str | os.PathLike,
    flag: str,
    suffixes: Sequence[str],
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """Refuse ``path`` as ``flag``'s output file (see the module docstring); returns it, ``~`` expanded."""
    out = Path(path).expanduser()
    if out.suffix.lower() not in suffixes:
        raise UserError(f"{flag} {path}: the file name must end in {' or '.join(suffixes)}; e.g. {flag} report"
                        f"{suffixes[0]}")  # fmt: skip
    real = _resolve(out, flag)
    _refuse_inputs_and_runs(real, flag, path, inputs)
    if os.path.lexists(out):
        mode = os.stat(real).st_mode if real.exists() else None
        if mode is None:
            raise UserError(f"{flag} {path} is a broken symbolic link; remove it or choose another path")
        if not _is_regular(mode):
            raise UserError(f"{flag} {path} is {file_kind(mode)}; give a file name, e.g. {out / ('out' + suffixes[0])}")
        if not overwrite:
            raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it, or choose another path")
    _check_writable(out, flag, path)
    return out


def check_output_folder(
    path: str | os.PathLike, flag: str, inputs: Iterable[str | os.PathLike] = ()
) -> Path:  # fmt: skip
    """``flag``'s output folder: not a file, not under a file, writable, not an input, not a run's own folder."""
    out = Path(path).expanduser()
    real = _resolve(out, flag)
    if os.path.lexists(out) and not real.is_dir():
        what = "a broken symbolic link" if not real.exists() else file_kind(os.stat(real).st_mode)
        what = "a file" if real.is_file() else what
        raise UserError(f"{flag} {path} is {what}, not a folder; choose a folder for the output")
    _refuse_inputs_and_runs(real, flag, path, inputs)
    _check_writable(out, flag, path)
    return out


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def _resolve(out: Path, flag: str) -> Path:
    try:
        return out.absolute().resolve()
    except (OSError, RuntimeError) as exc:  # Python < 3.13: RuntimeError for a symbolic link loop
        raise UserError(f"{flag} {out} cannot be resolved ({exc}): a symbolic link loop? choose another path") from None


def _refuse_inputs_and_runs(real: Path, flag: str, shown, inputs: Iterable[str | os.PathLike]) -> None:
    for given in inputs:
        try:
            source = Path(given).expanduser().absolute().resolve()
        except (OSError, RuntimeError):
            continue
        if real == source or source in real.parents:
            raise UserError(f"{flag} {shown} would overwrite this command's input {given}; choose another path")
    for folder in real.parents:
        if (folder / MARKER).is_file():
            first = real.relative_to(folder).parts[0]
            if first in OUTPUTS:
                raise UserError(
                    f"{flag} {shown} is inside the run in {folder} ({first} belongs to that run and would be "
                    f"replaced); write beside it instead, e.g. {folder / ('eval' + real.suffix if real.suffix else '')}"
                )


def _check_writable(out: Path, flag: str, shown) -> None:
    absolute = out.absolute()
    parent = next(p for p in absolute.parents if os.path.lexists(p))
    if not parent.is_dir():
        raise UserError(f"{flag} {shown} is inside {parent}, which is a file; choose another path")
    read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    if read_only or not os.access(parent, os.W_OK | os.X_OK):
        why = "a read-only file system" if read_only else "no permission"
        raise UserError(f"{flag} {shown} cannot be written ({why} at {parent}); choose another path")
