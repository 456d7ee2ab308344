"""What ``accelerate launch --config_file F train.py`` will do, asked of accelerate itself.

``resolve`` runs accelerate's own ``launch_command`` (its parser, ``_validate_launch_command``, its choice
of launcher) with the launchers replaced by stand-ins that call the same env-preparing functions the real
ones call (``prepare_simple_launcher_cmd_env``, ``prepare_multi_gpu_env``, ``prepare_deepspeed_cmd_env``)
and stop before anything starts. The processes per machine, the environment they get (CUDA_VISIBLE_DEVICES,
ACCELERATE_USE_CPU, mixed precision) and the port check are accelerate's answers, on this machine or on a
described one (``Environment``). What happens inside the processes is train.py's (``ranks.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from accel_train.doctor.environment import Environment, parse_visible_devices

SCRIPT = "train.py"  # any name: accelerate only passes it on
MULTI_LAUNCHERS = ("torchrun", "deepspeed", "mpirun")
# accelerate runs `mpirun --version` to choose between Open MPI's and Intel MPI's flag names; the doctor
# needs no flag names (and must not need mpirun on the machine it describes): Open MPI's stand in.
_MPIRUN_ARGS = ("mpirun", "--hostfile", "-n", "--npernode", "--bind-to")


@dataclass
class LaunchPlan:
    """accelerate's resolved arguments and the processes' environment, then what train.py makes of them."""

    argv: list[str]  # after `accelerate launch`
    dt: str  # the config's distributed_type
    args: argparse.Namespace  # as accelerate resolved them (config file + command line)
    launcher: str  # simple | mpirun | torchrun | deepspeed | xla | sagemaker
    launched_env: dict[str, str]  # the environment accelerate gives the processes
    shell_env: dict[str, str]  # the environment they would inherit without accelerate
    port_busy: bool = False
    # what train.py makes of it (ranks.py)
    per_machine: int = 1
    world_size: int = 1
    relaunch: bool = False  # train.py starts the ranks itself (elastic.relaunch_as_ranks)
    refusal: str | None = None  # train.py's one line when it refuses the launch
    rank_env: dict[str, str] = field(default_factory=dict)
    n_gpus: int = 0  # GPUs each process sees
    device: str = "cpu"
    backend: str | None = None
    run_dt: str = "NO"  # the Accelerator's distributed_type inside the run
    data_parallel: bool = False

    @property
    def cpu_flag(self) -> bool:  # accelerate launch --cpu
        return bool(self.args.cpu)

    @property
    def mp(self) -> str:
        return str(self.args.mixed_precision).lower()

    @property
    def gpu_ids_list(self) -> list | None:
        return None if self.args.gpu_ids == "all" else parse_visible_devices(self.args.gpu_ids)

    @property
    def cuda_visible_devices(self) -> str | None:
        return self.rank_env.get("CUDA_VISIBLE_DEVICES")

    @property
    def hidden_by_gpu_ids(self) -> bool:
        return self.gpu_ids_list == []

    @property
    def hidden_by_env(self) -> bool:
        return self.args.gpu_ids == "all" and parse_visible_devices(self.shell_env.get("CUDA_VISIBLE_DEVICES")) == []

    @property
    def multi_launcher(self) -> bool:
        return self.launcher in MULTI_LAUNCHERS


class Refused(Exception):
    """accelerate launch stops before starting anything; ``cause`` is its exception."""

    def __init__(self, cause: BaseException):
        super().__init__(" ".join(f"{type(cause).__name__}: {cause}".split()))
        self.cause = cause


def _stand_ins(seen: dict[str, Any], validate) -> dict[str, Any]:
    """accelerate's launchers, stopped where they would start processes (and its validation, recorded)."""
    from accelerate.utils import launch as prepare

    def validated(args):
        args, defaults, mp_from_config = validate(args)
        seen["defaults"] = defaults
        return args, defaults, mp_from_config

    def simple(args):
        cmd, env = prepare.prepare_simple_launcher_cmd_env(args)
        seen.update(launcher="mpirun" if cmd[0] == _MPIRUN_ARGS[0] else "simple", args=args, env=env)

    def multi_gpu(args):
        seen.update(launcher="torchrun", args=args, env=prepare.prepare_multi_gpu_env(args))

    def deepspeed(args):
        seen.update(launcher="deepspeed", args=args, env=prepare.prepare_deepspeed_cmd_env(args)[1])

    def xla(args):
        seen.update(launcher="xla", args=args, env=dict(os.environ))

    def sagemaker(defaults, args):
        seen.update(launcher="sagemaker", args=args, env={})

    return {
        "_validate_launch_command": validated,
        "simple_launcher": simple,
        "multi_gpu_launcher": multi_gpu,
        "deepspeed_launcher": deepspeed,
        "tpu_launcher": xla,
        "tpu_pod_launcher": xla,
        "sagemaker_launcher": sagemaker,
    }


def shell_environment(env: Environment) -> dict[str, str]:
    """This process's environment without launcher variables, with ``env``'s CUDA_VISIBLE_DEVICES."""
    from accel_train.doctor.launching import child_env

    shell = child_env()
    shell.pop("CUDA_VISIBLE_DEVICES", None)
    if env.cuda_visible_devices is not None:
        shell["CUDA_VISIBLE_DEVICES"] = env.cuda_visible_devices
    return shell


def _accelerate_launch(argv: list[str], shell: dict[str, str], port_in_use) -> dict[str, Any]:
    """Run accelerate's ``launch_command`` on ``argv`` up to the point where it would start processes."""
    from accelerate.commands import launch as cli
    from accelerate.utils import launch as prepare

    args = cli.launch_command_parser().parse_args(argv)
    seen: dict[str, Any] = {}
    free_ports: list[int] = []  # main_process_port 0: accelerate picks a free one, nothing to check
    get_free_port = prepare.get_free_port

    def free_port() -> int:
        free_ports.append(get_free_port())
        return free_ports[-1]

    def checked(port: int) -> bool:
        return port not in free_ports and port_in_use(port)

    quiet = logging.getLogger(cli.__name__)  # its "values were not passed" notes
    with contextlib.ExitStack() as stack:
        for name, stand_in in _stand_ins(seen, cli._validate_launch_command).items():
            stack.enter_context(mock.patch.object(cli, name, stand_in))
        stack.enter_context(mock.patch.object(prepare, "get_free_port", free_port))
        stack.enter_context(mock.patch.object(prepare, "is_port_in_use", checked))
        stack.enter_context(mock.patch.object(prepare, "is_fp8_available", lambda: True))  # checks.py asks
        stack.enter_context(mock.patch.object(prepare, "_get_mpirun_args", lambda: _MPIRUN_ARGS))
        stack.enter_context(mock.patch.dict(os.environ, shell, clear=True))
        stack.enter_context(mock.patch.object(quiet, "disabled", True))
        stack.enter_context(warnings.catch_warnings(record=True))  # the port warning: args.standalone says it
        try:
            cli.launch_command(args)
        except Exception as exc:  # noqa: BLE001 - accelerate launch would stop here: a finding
            raise Refused(exc) from exc
    return seen


def resolve(path: str, env: Environment, launch_args: tuple[str, ...] = ()) -> LaunchPlan:
    """accelerate's plan for ``accelerate launch [launch_args] --config_file path`` on ``env``.

    Raises ``Refused`` when accelerate would stop before starting anything. When a port in use is what
    stops it (rank 0 of several machines), ``port_busy`` says so and the plan is made with the port free.
    """
    argv = [*launch_args, "--config_file", str(path), SCRIPT]
    shell = shell_environment(env)
    try:
        seen = _accelerate_launch(argv, shell, env.port_in_use)
        busy = bool(getattr(seen["args"], "standalone", False))  # accelerate warned and picks another port
    except Refused as refused:
        if not isinstance(refused.cause, ConnectionError):
            raise
        seen, busy = _accelerate_launch(argv, shell, lambda port: False), True
    dt = seen["defaults"].distributed_type
    return LaunchPlan(argv, str(getattr(dt, "value", dt)), seen["args"], seen["launcher"], seen["env"], shell, busy)
