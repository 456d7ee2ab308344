"""Start the N CPU ranks a ``MULTI_CPU`` accelerate config asks for, when accelerate starts only one.

``accelerate config`` answered "multi-CPU, N processes" writes ``distributed_type: MULTI_CPU``,
``num_processes: N``, ``use_cpu: true``. accelerate 1.15 starts such a config through its simple
launcher, which without mpirun runs ONE process; because more were asked for it sets ``MASTER_ADDR``
and ``MASTER_PORT``, but nothing says how many (no ``WORLD_SIZE``, no ``RANK``).

That process (the only one) calls :func:`relaunch_as_ranks` before the Accelerator exists. It reads
its parent's command line (``/proc/<ppid>/cmdline``: ``... accelerate launch [options] script args``),
parses it with accelerate's own ``launch_command_parser``, loads the same config file with
accelerate's loader and applies the command line's ``--num_processes``/``--num_machines``, as
``accelerate launch`` did. On one machine it then replaces itself (``os.execve``) with a torch
elastic launcher (torchrun's machinery, :func:`main` below) that starts the N ranks with GPUs hidden:
they join a gloo group on the CPU (``runtime.wants_cpu_ranks``). The exit code of the first failed
rank becomes this process's exit code, so ``accelerate launch`` sees it as it would have seen ours.

Where that cannot work (several machines, a parent that is not ``accelerate launch``, no ``/proc``)
nothing happens here and ``runtime.check_launch`` refuses the run with its one line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_MPI_WORLD_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_world_size(env: dict[str, str] | os._Environ = os.environ) -> int:
    """How many processes the launcher actually started (1 when run plainly)."""
    for var in ("WORLD_SIZE", *_MPI_WORLD_VARS):
        if env.get(var):
            return int(env[var])
    return 1


# Set in the ranks' (and their launcher's) environment: they are the relaunch, never relaunch again.
RELAUNCHED = "ACCEL_TRAIN_MULTI_CPU_RANKS"
_CLI_MODULE = "accelerate.commands.accelerate_cli"
_LAUNCH_MODULE = "accelerate.commands.launch"
_QUIET_LAUNCH_MODULE = "accel_train.commands.launch"  # accelerate launch with an exit code for batch jobs (Slurm)


def started_alone_by_simple_launcher(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """The one process accelerate's simple launcher started for a config that asked for more (see
    ``runtime.check_launch``): ``ACCELERATE_USE_CPU`` and ``MASTER_PORT`` set, no world size, no mpirun."""
    asked_for_many = env.get("ACCELERATE_USE_CPU") is not None and env.get("MASTER_PORT") is not None
    return asked_for_many and launched_world_size(env) == 1 and not env.get(RELAUNCHED)


def parent_cmdline(pid: int | None = None) -> list[str] | None:
    """The command line of process ``pid`` (this process's parent by default); None without ``/proc``."""
    pid = os.getppid() if pid is None else pid
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="surrogateescape") for part in raw.split(b"\0")[:-1]] or None


def launch_argv(cmdline: Sequence[str]) -> list[str] | None:
    """The arguments after ``accelerate launch`` in ``cmdline``; None when it is not an accelerate launch.

    Recognised: ``accelerate launch ...`` (the console script, run by any interpreter),
    ``python -m accelerate.commands.accelerate_cli launch ...``, ``accelerate-launch ...``,
    ``python -m accelerate.commands.launch ...`` and ``python -m accel_train.commands.launch ...``.
    """
    for i, arg in enumerate(cmdline):
        after = list(cmdline[i + 1 :])
        if i > 0 and cmdline[i - 1] == "-m":  # python -m MODULE ...
            if arg in (_LAUNCH_MODULE, _QUIET_LAUNCH_MODULE):
                return after
            if arg == _CLI_MODULE and after[:1] == ["launch"]:
                return after[1:]
        elif os.path.basename(arg) == "accelerate-launch":
            return after
        elif os.path.basename(arg) == "accelerate" and after[:1] == ["launch"]:
            return after[1:]
    return None


def parse_launch_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """``argv`` parsed by accelerate's own ``accelerate launch`` parser; None if it rejects them."""
    from accelerate.commands.launch import launch_command_parser

    with contextlib.redirect_stderr(io.StringIO()):  # its usage text: the refusal line says what matters
        try:
            return launch_command_parser().parse_args(list(argv))
        except SystemExit:
            return None


@dataclass(frozen=True)
class Request:
    """What ``accelerate launch`` was asked for: its config file with the command line's overrides."""

    num_processes: int
    num_machines: int
    main_process_port: int | None
    max_restarts: int
    monitor_interval: float
    script: tuple[str, ...]  # what follows torchrun's options: [-m|--no-python] script args
    asked_by: str = "this MULTI_CPU config"  # what asked for CPU ranks; "" when nothing did (distributed_type NO)


def _load_config(config_file: str | None):
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(config_file)


def requested(args: argparse.Namespace, load: Callable[[str | None], object] = _load_config) -> Request:
    """Resolve ``args`` as ``accelerate launch`` does: a command-line value wins over the config file's.

    The config file is ``--config_file``, or accelerate's default one when it exists and ``--cpu`` was
    not given (the rule of accelerate's ``_validate_launch_command``).
    """
    from accelerate.commands.config import default_config_file

    config = None
    if args.config_file is not None or (os.path.isfile(default_config_file) and not args.cpu):
        config = load(args.config_file)

    def value(name: str, fallback):
        if getattr(args, name, None) is not None:
            return getattr(args, name)
        found = getattr(config, name, None)
        return fallback if found is None else found

    script = (["-m"] if args.module else ["--no-python"] if args.no_python else []) + [args.training_script]
    distributed_type = getattr(config, "distributed_type", None)
    asked_by = "this MULTI_CPU config" if getattr(distributed_type, "value", distributed_type) == "MULTI_CPU" else ""
    return Request(
        num_processes=int(value("num_processes", 1)),
        num_machines=int(value("num_machines", 1)),
        main_process_port=value("main_process_port", None),
        max_restarts=int(value("max_restarts", 0)),
        monitor_interval=float(value("monitor_interval", 0.1)),
        script=(*script, *args.training_script_args),
        asked_by="accelerate launch --cpu" if args.cpu else asked_by,
    )


def request_from_parent(cmdline: Sequence[str] | None) -> Request | None:
    """The parent's ``accelerate launch`` request, or None when ``cmdline`` is not one (or unreadable)."""
    argv = launch_argv(cmdline or [])
    args = None if argv is None else parse_launch_args(argv)
    if args is None or not args.training_script:
        return None
    try:
        return requested(args)
    except (OSError, ValueError, TypeError, KeyError):  # a config file accelerate itself would refuse
        return None


def can_start_ranks(request: Request | None) -> bool:
    """CPU ranks asked for (a MULTI_CPU config, or ``--cpu``) on one machine: they can be started here.

    Several machines cannot; nor is a ``distributed_type: NO`` config's num_processes taken as a request.
    """
    return request is not None and bool(request.asked_by) and request.num_machines == 1 and request.num_processes > 1


def rendezvous_port(request: Request, in_use: Callable[[int], bool] | None = None) -> int:
    """The config's ``main_process_port`` when it names a free one, else 0 (the store picks a free port)."""
    port = int(request.main_process_port or 0)
    if port <= 0:
        return 0
    if in_use is None:
        from accelerate.utils import is_port_in_use as in_use
    return 0 if in_use(port) else port


def launcher_argv(request: Request, port: int, python: str = sys.executable) -> list[str]:
    """This module's launcher (torchrun's options) starting ``request.num_processes`` ranks on this machine."""
    return [
        python,
        "-m",
        "accel_train.elastic",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(request.num_processes),
        "--rdzv_backend",
        "c10d",  # elastic rendezvous: accelerate launch --max_restarts can restart the ranks
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--max_restarts",
        str(request.max_restarts),
        "--monitor_interval",
        str(request.monitor_interval),
        *request.script,
    ]


def ranks_env(env: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The launcher's environment: GPUs hidden (gloo on CPU, as ``use_cpu: true`` asks), the simple
    launcher's rendezvous variables dropped (torchrun sets the ranks' own), and marked as the relaunch."""
    out = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    out.update({"CUDA_VISIBLE_DEVICES": "", RELAUNCHED: "1"})
    return out


def relaunch_line(num_processes: int, asked_by: str = "this MULTI_CPU config") -> str:
    return (
        f"accel_train: {asked_by} asked for {num_processes} processes; accelerate starts one without "
        f"mpirun, so accel_train starts the {num_processes} ranks itself (torch elastic, gloo)"
    )


def relaunch_as_ranks(env: dict[str, str] | os._Environ = os.environ, cmdline: Sequence[str] | None = None) -> None:
    """In the lone process of a many-process simple launch: become the launcher of the N ranks.

    Returns (doing nothing) everywhere else, and where the ranks cannot be started here; then
    ``runtime.check_launch`` refuses the run. Does not return when it relaunches.
    """
    if not started_alone_by_simple_launcher(env):
        return
    request = request_from_parent(parent_cmdline() if cmdline is None else cmdline)
    if not can_start_ranks(request):
        return
    argv = launcher_argv(request, rendezvous_port(request))
    print(relaunch_line(request.num_processes, request.asked_by), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(argv[0], argv, ranks_env(env))


def exit_code_of(exc: BaseException) -> int:
    """The launcher's exit code for a failed run: the first failed rank's code, 128+N for signal N."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(exc, ChildFailedError):
        code = exc.get_first_failure()[1].exitcode
        if code < 0:  # killed by signal -code
            return 128 - code
        return code or 1
    if isinstance(exc, SignalException):
        return 128 + int(exc.sigval)
    return 1


_LEFT_KEY = "accel_train/agent-left/"  # + group rank: that machine's launcher is done with the rendezvous store


def leave_store_together(store, group_rank: int, group_world_size: int, timeout_s: float = 30.0) -> None:
    """The end of a launch over several machines, after torch elastic's exit barrier: the other machines' launchers
    say they are done with the rendezvous store, and machine 0's launcher, the one whose process holds that store
    (static rendezvous), waits for them before it exits.

    Without this, machine 0's launcher could arrive last at the exit barrier, pass it and exit, closing the store
    while another launcher was between the barrier's two requests: that one logged "Error waiting on exit barrier"
    and a DistNetworkError traceback after a run that had finished (pytorch/pytorch#69520; seen under Slurm). Best
    effort: a machine whose launcher never says so (it died) costs machine 0 ``timeout_s``; a store already gone
    is nothing to report."""
    from datetime import timedelta

    if group_world_size <= 1:
        return
    before = store.timeout
    try:
        store.set_timeout(timedelta(seconds=timeout_s))
        if group_rank == 0:
            store.wait([f"{_LEFT_KEY}{r}" for r in range(1, group_world_size)])
        else:
            store.set(f"{_LEFT_KEY}{group_rank}", "1")
    except Exception:  # noqa: BLE001 - a peer or the store gone: the run's outcome is already decided
        return
    with contextlib.suppress(Exception):
        store.set_timeout(before)


def leave_store_together_after_exit_barrier() -> bool:
    """Make torch elastic's launcher (``SimpleElasticAgent``) call :func:`leave_store_together` right after its exit
    barrier, in this process (``accel_train.commands.launch`` runs the launch in-process). Only for the static
    rendezvous (``--rdzv_backend static``, accelerate's default), where machine 0's launcher holds the store. False
    where this torch has no such barrier."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    barrier = getattr(SimpleElasticAgent, "_exit_barrier", None)
    if barrier is None:
        return False
    if getattr(barrier, "leaves_together", False):
        return True

    def exit_barrier(agent) -> None:
        barrier(agent)
        group, store = getattr(agent, "_worker_group", None), getattr(agent, "_store", None)
        with contextlib.suppress(Exception):
            static = agent._rdzv_handler.get_backend() == "static"  # machine 0's launcher holds the store
            if static and group is not None and store is not None:
                leave_store_together(store, group.group_rank, group.group_world_size)

    exit_barrier.leaves_together = True
    SimpleElasticAgent._exit_barrier = exit_barrier
    return True


def stop_when_parent_goes(poll_s: float = 0.5) -> None:
    """SIGTERM this launcher once its parent (``accelerate launch``) is gone.

    accelerate's simple launcher passes no signal on to its child: killed, it would leave this
    launcher and the ranks training for nobody. torch elastic answers the SIGTERM as torchrun does:
    the ranks get SIGTERM and stop at a step boundary with a checkpoint (``--resume auto``).
    """
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="accel_train-accelerate-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> None:
    """torchrun (``torch.distributed.run``) without its traceback after a rank's own error line.

    A rank that fails has already said why (``error: ...``) and torch elastic logs which rank
    exited with which code; the launcher then exits with that code instead of raising.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    stop_when_parent_goes()
    try:
        run(parse_args(list(sys.argv[1:] if argv is None else argv)))
    except (ChildFailedError, SignalException) as exc:
        sys.exit(exit_code_of(exc))


if __name__ == "__main__":
    main()
