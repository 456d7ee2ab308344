"""What ``accelerate launch`` will do with a config: launcher, processes, device, backend (accelerate 1.15).

Mirrors ``accelerate.commands.launch.launch_command``. The traps it leads to are in ``checks.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel_train.doctor.configfile import (
    CUDA_TYPES,
    MIXED_PRECISION_VALUES,
    TORCHRUN_TYPES,
    Diagnosis,
    _as_int,
    _plural,
)
from accel_train.doctor.environment import Environment, parse_visible_devices
from accel_train.runtime import fp16_ignored, should_use_data_parallel

MULTI_LAUNCHERS = ("torchrun", "deepspeed", "mpirun")


@dataclass
class LaunchPlan:
    """The config's numbers and what the launcher makes of them on ``env``."""

    dt: str
    cpu_flag: bool  # accelerate launch --cpu
    use_cpu: bool
    num_machines: int
    machine_rank: int
    num_processes: int
    raw_gpu_ids: Any
    gpu_ids: str
    gpu_ids_list: list | None
    env_ids: list | None
    mp: Any
    hostfile: Any
    launcher: str = "simple"
    per_machine: int = 1
    world_size: int = 1
    n_gpus: int = 0
    cpu_forced: bool = False
    device: str = "cpu"
    backend: str | None = None
    data_parallel: bool = False

    @property
    def hidden_by_gpu_ids(self) -> bool:
        return self.gpu_ids_list == []

    @property
    def hidden_by_env(self) -> bool:
        return self.env_ids == [] and self.gpu_ids == "all"

    @property
    def multi_launcher(self) -> bool:
        return self.launcher in MULTI_LAUNCHERS


def _distributed_type(cfg: dict[str, Any], diag: Diagnosis) -> str | None:
    raw_dt = cfg.get("distributed_type")
    if raw_dt is None:
        if "distributed_type" not in cfg:
            missing = "the config has no distributed_type; e.g. distributed_type: 'NO'"
            diag.add("error", "distributed-type-missing", missing)
        return None
    if not isinstance(raw_dt, str):
        if not any(f.code == "unquoted-yaml-scalar" and "distributed_type" in f.message for f in diag.findings):
            diag.add(
                "error", "invalid-value", f"distributed_type {raw_dt!r} is not a string such as 'NO' or 'MULTI_GPU'"
            )
        return None  # accelerate cannot pick a launcher from it
    return raw_dt


def _counts(cfg: dict[str, Any], dt: str, diag: Diagnosis) -> tuple[int, int, int] | None:
    num_machines = _as_int(cfg.get("num_machines"), 1)
    machine_rank = _as_int(cfg.get("machine_rank"), 0)
    num_processes = _as_int(cfg.get("num_processes"), 1 if dt == "NO" else -1)
    named = (("num_machines", num_machines), ("machine_rank", machine_rank), ("num_processes", num_processes))
    for key, value in named:
        if value is None:
            diag.add("error", "invalid-value", f"{key}: {cfg.get(key)!r} is not an integer")
    if num_machines is None or machine_rank is None or num_processes is None:
        return None
    if num_processes == -1:
        diag.add(
            "error",
            "num-processes-missing",
            f"distributed_type {dt} without num_processes: accelerate launch stops with "
            "'You need to manually pass in --num_processes'; add num_processes: N",
        )
        return None
    if num_processes < 1 or num_machines < 1:
        bad = ", ".join(f"{key}: {value}" for key, value in named[::2] if value < 1)
        diag.add(
            "error",
            "invalid-value",
            f"{bad} is invalid: num_processes and num_machines must be at least 1 (accelerate launch fails or "
            "ignores it); e.g. num_processes: 1",
        )
        return None
    return num_machines, machine_rank, num_processes


def read_plan(cfg: dict[str, Any], env: Environment, diag: Diagnosis, *, cpu: bool) -> LaunchPlan | None:
    """The launch plan, or None when the config cannot be launched at all (the reason is in ``diag``)."""
    dt = _distributed_type(cfg, diag)
    if dt is None:
        return None
    if cfg.get("compute_environment") == "AMAZON_SAGEMAKER":
        diag.plan = {"launcher": "sagemaker", "distributed_type": dt, "num_machines": cfg.get("num_machines", 1)}
        remote = "AMAZON_SAGEMAKER configs run remotely; only the file itself was checked"
        diag.add("info", "sagemaker-not-checked", remote)
        return None
    counts = _counts(cfg, dt, diag)
    if counts is None:
        return None
    raw_gpu_ids = cfg.get("gpu_ids")
    gpu_ids = "all" if raw_gpu_ids is None else str(raw_gpu_ids)
    raw_mp = cfg.get("mixed_precision")
    mp = "no" if raw_mp is None else raw_mp
    if isinstance(mp, str) and mp.lower() not in MIXED_PRECISION_VALUES:
        choices = ", ".join(MIXED_PRECISION_VALUES)
        diag.add("error", "invalid-value", f"mixed_precision: {mp!r} is not one of {choices}")
    mpirun_config = cfg.get("mpirun_config")
    plan = LaunchPlan(
        dt=dt,
        cpu_flag=cpu,
        use_cpu=cfg.get("use_cpu") is True,
        num_machines=counts[0],
        machine_rank=counts[1],
        num_processes=counts[2],
        raw_gpu_ids=raw_gpu_ids,
        gpu_ids=gpu_ids,
        gpu_ids_list=None if gpu_ids == "all" else parse_visible_devices(gpu_ids),
        env_ids=parse_visible_devices(env.cuda_visible_devices),
        mp=mp.lower() if isinstance(mp, str) else mp,
        hostfile=mpirun_config.get("mpirun_hostfile") if isinstance(mpirun_config, dict) else None,
    )
    _resolve_launch(plan, env)
    return plan


def _launcher(plan: LaunchPlan) -> str:
    if plan.cpu_flag:
        return "mpirun" if plan.hostfile else "simple"
    if plan.dt == "DEEPSPEED":
        return "deepspeed"
    if plan.dt in TORCHRUN_TYPES:
        return "torchrun"
    if plan.dt == "XLA":
        return "xla"
    return "mpirun" if plan.hostfile else "simple"


def _visible_gpus(plan: LaunchPlan, env: Environment) -> int:
    """GPUs the launched processes see (gpu_ids replaces CUDA_VISIBLE_DEVICES)."""
    physical = env.physical_gpus
    if plan.gpu_ids_list is None:
        return env.cuda_device_count
    if physical is None:
        return len(plan.gpu_ids_list)
    n_gpus = 0
    for gid in plan.gpu_ids_list:
        if not isinstance(gid, int) or gid >= physical:
            break
        n_gpus += 1
    return n_gpus


def _resolve_launch(plan: LaunchPlan, env: Environment) -> None:
    plan.launcher = _launcher(plan)
    if plan.multi_launcher:
        machines = plan.num_machines
        plan.per_machine = plan.num_processes // machines if machines > 1 else plan.num_processes
        plan.world_size = plan.per_machine * machines if plan.launcher != "mpirun" else plan.num_processes
    plan.n_gpus = _visible_gpus(plan, env)
    plan.cpu_forced = plan.cpu_flag or (plan.launcher in ("simple", "mpirun") and plan.use_cpu)
    if plan.launcher == "xla":
        plan.device = "xla"
    else:
        plan.device = "cpu" if plan.cpu_forced or plan.n_gpus == 0 else "cuda"
    if plan.world_size > 1:
        plan.backend = "nccl" if plan.device == "cuda" else "gloo" if plan.device == "cpu" else None
    # the rules train.py applies at run time (runtime.py owns them)
    plan.data_parallel = plan.launcher == "simple" and should_use_data_parallel(plan.dt, plan.device, plan.n_gpus)


def _why_cpu(plan: LaunchPlan, env: Environment) -> str:
    if plan.device != "cpu":
        return ""
    if plan.cpu_flag:
        return " (accelerate launch --cpu)"
    if plan.hidden_by_gpu_ids:
        return f" (GPUs hidden by gpu_ids {plan.gpu_ids!r})"
    if plan.hidden_by_env:
        return f" (GPUs hidden by CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r})"
    if plan.use_cpu and plan.cpu_forced:
        return " (use_cpu: true)"
    if plan.dt in CUDA_TYPES and plan.launcher in ("torchrun", "deepspeed"):
        return " (no CUDA device: train.py's fallback)"
    return ""


def _summary(plan: LaunchPlan, env: Environment) -> str:
    why_cpu = _why_cpu(plan, env)
    procs = _plural(plan.world_size, "process")
    multi_machine = plan.num_machines > 1 and plan.launcher != "simple"
    if multi_machine:
        procs += (
            f" ({plan.per_machine} per machine x {plan.num_machines} machines; "
            f"this is machine rank {plan.machine_rank})"
        )
    if plan.world_size > 1 or multi_machine:
        if plan.device == "cuda":
            where = f"on {_plural(plan.n_gpus, 'GPU')}" + (" per machine" if plan.num_machines > 1 else "")
        else:
            where = "on CPU" if plan.device == "cpu" else f"on {plan.device}"
        return f"{procs}, {plan.backend or plan.dt} DDP {where}{why_cpu}"
    if plan.data_parallel:
        return f"1 process, nn.DataParallel over {plan.n_gpus} GPUs"
    if plan.device == "cuda":
        return f"1 process on cuda:0 (of {_plural(plan.n_gpus, 'visible GPU')})"
    return f"1 process on {plan.device}{why_cpu}"


def describe(plan: LaunchPlan, env: Environment) -> dict[str, Any]:
    """The plan as the report shows it (``Diagnosis.plan``)."""
    if fp16_ignored(plan.mp, plan.device):
        effective_mp = "no (fp16 ignored on CPU)"
    elif isinstance(plan.mp, str):
        effective_mp = plan.mp
    else:
        effective_mp = f"{plan.mp!r} (invalid)"
    return {
        "summary": _summary(plan, env),
        "launcher": plan.launcher,
        "processes_per_machine": plan.per_machine,
        "num_machines": plan.num_machines,
        "machine_rank": plan.machine_rank,
        "world_size": plan.world_size,
        "backend": plan.backend,
        "device": plan.device,
        "visible_gpus": plan.n_gpus if plan.device == "cuda" else 0,
        "gpu_ids": plan.gpu_ids,
        "mixed_precision": effective_mp,
        "distributed_type": plan.dt,
        "data_parallel": plan.data_parallel,
    }
