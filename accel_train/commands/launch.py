"""``accelerate launch`` for batch jobs: the same launch, with an exit code instead of the launcher's traceback.

python -m accel_train.commands.launch [accelerate launch options] scripts/train.py [train.py options]

accelerate's torchrun-based launch raises when a rank exits non-zero (``ChildFailedError``) or when the launcher
itself gets SIGTERM (``SignalException``, as every process of a Slurm job step does), and Python prints some 30 lines
of traceback after the rank's own one-line ending ("stopped at step N (received SIGTERM); checkpoint saved"). Here
the launch exits instead with the first failed rank's code (143: stopped by SIGTERM with a checkpoint saved), with
128 + N when the launcher itself was stopped by signal N, and with 0 when every rank finished: codes a batch script
acts on (``scripts/slurm/train.sbatch``). accelerate's simple launcher (one process: ``distributed_type: NO`` or
``MULTI_CPU``) raises ``CalledProcessError`` for a non-zero exit; it gives that process's code the same way.

The config file (``--config_file``, else accelerate's default one if it exists) is checked first as the launch doctor
checks it (``doctor.diagnose.check_config_file``): a missing file, one that is not a mapping (a YAML list), an
unknown ``distributed_type`` or key, an unquoted ``NO``, ... end with one line and exit code 2 instead of
accelerate's traceback. Any other failure keeps its traceback. ``accel_train.elastic.launch_argv`` knows this
command line as an ``accelerate launch``. Over several machines, machine 0's launcher waits at the end until the
others are done with its rendezvous store (``elastic.leave_store_together``): torch elastic alone could close it
under them and print a traceback after a finished run (pytorch/pytorch#69520).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence

from accel_train.doctor.configfile import MULTI_CONFIG
from accel_train.errors import UserError


def check_config(path: str | None) -> None:
    """A ``UserError`` (one line) when accelerate's launch would fail on the config file ``path`` (None: accelerate's
    default file, when there is one): the launch doctor's first error, and the command that lists them all."""
    from accelerate.commands.config.config_args import default_config_file

    from accel_train.doctor.diagnose import check_config_file

    if path is None and not os.path.isfile(default_config_file):
        return  # accelerate launches with its defaults
    path = default_config_file if path is None else path
    if not os.path.isfile(path):
        raise UserError(f"--config_file {path}: file not found; pass an accelerate config file, e.g. {MULTI_CONFIG}")
    diag, _ = check_config_file(path)
    if diag.errors:
        more = f" ({len(diag.errors) - 1} more problem(s))" if len(diag.errors) > 1 else ""
        raise UserError(
            f"accelerate config {path}: {diag.errors[0].message}{more}; fix the file (python scripts/doctor.py "
            f"--config_file {path} checks it)"
        )


def check_train_args(script: str, script_args: Sequence[str]) -> None:
    """train.py's flags, checked here as train.py checks them: a usage error fails the same way in every rank at
    every restart (--max_restarts 3 tried it 4 times), so it is one line before any rank starts."""
    if os.path.basename(script) not in ("train.py", "accel-train") or {"-h", "--help"} & set(script_args):
        return
    from accel_train.config import parse_config

    parse_config(list(script_args))


def main(argv: Sequence[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from accel_train.elastic import exit_code_of, leave_store_together_after_exit_barrier

    args = launch_command_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        check_config(args.config_file)
        check_train_args(args.training_script, args.training_script_args)
    except UserError as exc:
        print(f"error: {' '.join(str(exc).splitlines())}", file=sys.stderr, flush=True)
        return exc.exit_code
    leave_store_together_after_exit_barrier()  # several machines: no traceback from torch elastic at the end
    with _error_file() as posted:
        try:
            launch_command(args)
        except (ChildFailedError, SignalException) as exc:
            return _end(exit_code_of(exc), posted)
        except subprocess.CalledProcessError as exc:  # the simple launcher's one process: its line is the last
            return 128 - exc.returncode if exc.returncode < 0 else exc.returncode
    return 0


@contextlib.contextmanager
def _error_file():
    """A file the started processes post their one-line error to (``cli.ERROR_FILE``); removed afterwards."""
    import tempfile

    from accel_train.cli import ERROR_FILE

    fd, path = tempfile.mkstemp(prefix="accel-train-errors-", suffix=".txt")
    os.close(fd)
    before = os.environ.get(ERROR_FILE)
    os.environ[ERROR_FILE] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(ERROR_FILE, None)
        else:
            os.environ[ERROR_FILE] = before
        with contextlib.suppress(OSError):
            os.unlink(path)


def _end(code: int, posted: str) -> int:
    """The launch's exit: the first rank's one-line error repeated as the very last line (torchrun's report of
    the failure comes after the rank's own line), and that rank's exit code."""
    try:
        with open(posted, errors="replace") as fh:
            first = fh.readline().strip()
    except OSError:
        first = ""
    if first:
        print(first, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
