"""``accelerate launch`` for batch jobs: the same launch, with an exit code instead of the launcher's traceback.

python -m accel_train.commands.launch [accelerate launch options] scripts/train.py [train.py options]

accelerate's torchrun-based launch raises when a rank exits non-zero (``ChildFailedError``) or when the launcher
itself gets SIGTERM (``SignalException``, as every process of a Slurm job step does), and Python prints some 30 lines
of traceback after the rank's own one-line ending ("stopped at step N (received SIGTERM); checkpoint saved"). Here
the launch exits instead with the first failed rank's code (143: stopped by SIGTERM with a checkpoint saved), with
128 + N when the launcher itself was stopped by signal N, and with 0 when every rank finished: codes a batch script
acts on (``scripts/slurm/train.sbatch``). accelerate's simple launcher (one process: ``distributed_type: NO`` or
``MULTI_CPU``) raises ``CalledProcessError`` for a non-zero exit; it gives that process's code the same way. Any other
failure keeps its traceback. ``accel_train.elastic.launch_argv`` knows this command line as an ``accelerate launch``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from accel_train.elastic import exit_code_of

    args = launch_command_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        launch_command(args)
    except (ChildFailedError, SignalException) as exc:
        return exit_code_of(exc)
    except subprocess.CalledProcessError as exc:  # the simple launcher's one process
        return 128 - exc.returncode if exc.returncode < 0 else exc.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
