"""The traps a launch plan falls into, one function each, in the order the report lists them."""

from __future__ import annotations

from typing import Any

from accel_train.doctor.configfile import CUDA_TYPES, MULTI_CONFIG, MULTI_DEVICE_TYPES, Diagnosis, _as_int, _plural
from accel_train.doctor.environment import Environment
from accel_train.doctor.plan import LaunchPlan
from accel_train.runtime import fp16_ignored


def _one_process_launchers(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if plan.launcher == "simple" and plan.num_processes > 1:
        n = plan.num_processes
        if (plan.dt == "MULTI_CPU" or plan.cpu_flag) and plan.num_machines == 1:
            diag.add(
                "info",
                "multi-cpu-relaunched",
                f"accelerate's simple launcher starts ONE process for {n} CPU processes (no mpirun); train.py "
                f"starts the {n} ranks itself (torch elastic launcher, gloo DDP on CPU), as {MULTI_CONFIG} does",
            )
        elif plan.dt == "MULTI_CPU" and not plan.cpu_flag:
            reason = (
                "mpirun is not installed" if not env.mpirun_available else "no mpirun_config.mpirun_hostfile is set"
            )
            diag.add(
                "error",
                "multi-cpu-one-process",
                f"distributed_type MULTI_CPU with num_processes {n}: accelerate uses its simple launcher "
                f"because {reason}, so only ONE process would start per machine, and train.py starts the ranks "
                f"itself only on one machine (here it refuses to run). For gloo DDP on CPU "
                f"use {MULTI_CONFIG} (torchrun with GPUs hidden), or set num_processes: 1",
            )
        elif plan.cpu_flag:
            diag.add(
                "error",
                "cpu-flag-one-process",
                f"accelerate launch --cpu always uses the simple launcher: ONE process, not {n}. "
                f"For gloo DDP on CPU use {MULTI_CONFIG} without --cpu",
            )
        else:
            diag.add(
                "warning",
                "num-processes-ignored",
                f"distributed_type {plan.dt} uses the simple launcher: ONE process starts, num_processes "
                f"{n} is ignored. For several processes use MULTI_GPU (or {MULTI_CONFIG} on CPU)",
            )
    if plan.launcher == "mpirun" and not env.mpirun_available:
        diag.add(
            "error",
            "mpirun-missing",
            f"mpirun_config.mpirun_hostfile is set ({plan.hostfile}) but neither mpirun nor mpiexec is installed; "
            f"accelerate launch fails. Install MPI or use {MULTI_CONFIG}",
        )


def _use_cpu_ignored(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if not (plan.use_cpu and plan.launcher in ("torchrun", "deepspeed")):
        return
    if env.cuda_device_count > 0 and not plan.hidden_by_gpu_ids and not plan.hidden_by_env:
        diag.add(
            "warning",
            "use-cpu-ignored",
            f"use_cpu: true is ignored by the {plan.launcher} launcher (accelerate only passes it to the simple "
            f"launcher): the {plan.per_machine} processes will use the GPUs. To train on CPU hide the GPUs "
            f"({MULTI_CONFIG}: gpu_ids '-1,-1')",
        )
    else:
        diag.add("info", "use-cpu-ignored", f"use_cpu: true has no effect with the {plan.launcher} launcher")


def _too_few_gpu_ids(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if not (
        plan.dt in MULTI_DEVICE_TYPES
        and plan.num_machines <= 1
        and isinstance(plan.raw_gpu_ids, str)
        and plan.gpu_ids != "all"
        and len(plan.gpu_ids.split(",")) < 2
    ):
        return
    if plan.hidden_by_gpu_ids:
        fix = "to hide every GPU write gpu_ids: '-1,-1' (CUDA still sees none, accelerate sees two ids)"
    else:
        fix = "list at least two GPUs, use gpu_ids: 'all', or for one GPU use distributed_type: 'NO'"
    diag.add(
        "error",
        "too-few-gpu-ids",
        f"distributed_type {plan.dt} on one machine with gpu_ids {plan.gpu_ids!r}: accelerate launch refuses it "
        f"('Less than two GPU ids were configured'); {fix}",
    )


def _gpu_types_without_gpu(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if not (plan.dt in CUDA_TYPES and plan.launcher in ("torchrun", "deepspeed")):
        return
    hidden = plan.hidden_by_gpu_ids or plan.hidden_by_env
    if env.cuda_device_count == 0 and not hidden:
        extra = "" if plan.dt == "MULTI_GPU" else f" ({plan.dt} itself may not support CPU)"
        diag.add(
            "warning",
            "multi-gpu-without-gpu",
            f"distributed_type {plan.dt} but this machine has no CUDA device: torchrun still starts "
            f"{plan.per_machine} processes and train.py falls back to gloo DDP on CPU{extra}. To mean it, use "
            f"{MULTI_CONFIG}",
        )
    elif plan.device == "cpu" and hidden:
        if plan.hidden_by_gpu_ids:
            hider = f"gpu_ids {plan.gpu_ids!r}"
        else:
            hider = f"CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r}"
        diag.add(
            "info",
            "gpus-hidden",
            f"GPUs hidden on purpose by {hider}: torchrun starts {plan.per_machine} ranks per machine and train.py "
            "joins them in a gloo process group on CPU",
        )


def _fp16_on_cpu(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if fp16_ignored(plan.mp, plan.device):
        diag.add(
            "warning",
            "fp16-on-cpu",
            "mixed_precision fp16 on CPU is silently ignored by accelerate (training runs in fp32); "
            "use mixed_precision: 'bf16', which works on CPU",
        )


FP8_BACKENDS = ("transformer_engine", "msamp", "torchao")  # what accelerate's is_fp8_available looks for


def _fp8_unavailable(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """accelerate launch stops with a RuntimeError traceback ('FP8 is not available on this machine')."""
    if plan.mp != "fp8":
        return
    import importlib.util

    fix = "use mixed_precision: 'bf16' (it works on CPU too) or 'no'"
    if plan.device != "cuda":
        diag.add(
            "error",
            "fp8-unavailable",
            f"mixed_precision fp8 needs a CUDA GPU (Ada/Hopper or newer) and Transformer Engine, MS-AMP or torchao; "
            f"this plan runs on {plan.device}, where accelerate launch or the run fails; {fix}",
        )
    elif not any(importlib.util.find_spec(name) for name in FP8_BACKENDS):
        diag.add(
            "error",
            "fp8-unavailable",
            "mixed_precision fp8 needs Transformer Engine, MS-AMP or torchao and none is installed: accelerate "
            f"launch stops with 'FP8 is not available on this machine'; install one, or {fix}",
        )


def _too_many_processes(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if not plan.multi_launcher:
        return
    per_machine, n_gpus = plan.per_machine, plan.n_gpus
    if plan.device == "cuda" and per_machine > n_gpus:
        diag.add(
            "error",
            "too-many-processes",
            f"{per_machine} processes per machine but only {_plural(n_gpus, 'GPU')} visible to them: each "
            f"process takes cuda:LOCAL_RANK, so local ranks {n_gpus}..{per_machine - 1} have no GPU. Set "
            f"num_processes to {n_gpus * plan.num_machines} or fewer",
        )
    elif plan.device == "cpu" and per_machine > env.cpu_count:
        diag.add(
            "warning",
            "too-many-processes",
            f"{per_machine} CPU processes per machine but only {_plural(env.cpu_count, 'core')}: "
            "they will oversubscribe the CPU and run slower than fewer processes",
        )


def _gpu_ids_vs_machine(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    physical, ids, gpu_ids = env.physical_gpus, plan.gpu_ids_list, plan.gpu_ids
    missing = [g for g in ids or [] if isinstance(g, int) and physical and g >= physical]
    if missing:
        diag.add(
            "error",
            "gpu-ids-missing",
            f"gpu_ids {gpu_ids!r} names GPU {missing[0]} but this machine has {_plural(physical, 'GPU')} "
            f"(0..{physical - 1}). gpu_ids are physical indices: accelerate sets CUDA_VISIBLE_DEVICES to "
            "gpu_ids, and inside the processes the chosen GPUs are renumbered from 0 "
            "(gpu_ids '2,3' -> cuda:0, cuda:1)",
        )
    if ids and env.cuda_visible_devices is not None and ids != plan.env_ids:
        diag.add(
            "warning",
            "gpu-ids-override-cvd",
            f"CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r} is set but accelerate replaces it with gpu_ids "
            f"{gpu_ids!r}: the processes see physical GPUs {gpu_ids}, renumbered from 0. To keep your "
            "selection, drop gpu_ids (or set gpu_ids: 'all')",
        )


def _port_in_use(plan: LaunchPlan, env: Environment, diag: Diagnosis, cfg: dict[str, Any]) -> None:
    port = _as_int(cfg.get("main_process_port"), 29500)
    multi_process = plan.world_size > 1 or plan.num_machines > 1
    if not (plan.multi_launcher and multi_process and port and port > 0):
        return
    if not (plan.num_machines <= 1 or plan.machine_rank == 0) or not env.port_in_use(port):
        return
    if plan.num_machines <= 1 and plan.launcher != "mpirun":
        diag.add(
            "warning",
            "port-in-use",
            f"main_process_port {port} is in use (another run?); accelerate will warn and pick a free port. "
            "Set main_process_port: 0 to always pick one",
        )
    else:
        diag.add(
            "error",
            "port-in-use",
            f"main_process_port {port} is in use on this machine (rank 0 of the rendezvous): the launch "
            "fails with ConnectionError. Stop the other run or choose another port in the config and on "
            "every machine",
        )


def _single_process_notes(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if plan.data_parallel:
        diag.add(
            "info",
            "dp-single-process",
            f"distributed_type NO with {plan.n_gpus} visible GPUs: one process; train.py wraps the model in "
            "nn.DataParallel. multi-process DDP (distributed_type MULTI_GPU) is faster",
        )
    elif plan.dt == "NO" and plan.device == "cpu" and env.cuda_device_count == 0 and plan.gpu_ids_list:
        diag.add("info", "no-gpu", f"gpu_ids {plan.gpu_ids!r} but no CUDA device here: runs on CPU")


def _multi_machine(plan: LaunchPlan, env: Environment, diag: Diagnosis, cfg: dict[str, Any]) -> None:
    machines, rank, n = plan.num_machines, plan.machine_rank, plan.num_processes
    if machines <= 1:
        return
    if not cfg.get("main_process_ip"):
        diag.add(
            "error",
            "main-process-ip-missing",
            f"num_machines {machines} without main_process_ip: the other machines cannot find rank 0; "
            "set main_process_ip to the address of the machine with machine_rank 0",
        )
    if plan.multi_launcher and n % machines:
        diag.add(
            "error",
            "num-processes-not-divisible",
            f"num_processes {n} is not divisible by num_machines {machines}: torchrun would "
            f"start {n // machines} per machine ({plan.per_machine * machines} in all). "
            "num_processes is the TOTAL over all machines",
        )
    if not 0 <= rank < machines:
        diag.add(
            "error",
            "machine-rank-out-of-range",
            f"machine_rank {rank} must be between 0 and num_machines - 1 ({machines - 1})",
        )
    if plan.launcher == "simple" and cfg.get("main_process_port") is None:
        diag.add(
            "error",
            "main-process-port-missing",
            "the simple launcher needs main_process_port when num_machines > 1 (accelerate asserts it)",
        )


def _fsdp2_ram_efficient_loading(cfg: dict[str, Any], diag: Diagnosis) -> None:
    """accelerate issue #3898: FSDP2 + cpu_ram_efficient_loading reads .device_mesh from plain buffers."""
    fsdp = cfg.get("fsdp_config") if str(cfg.get("distributed_type", "")).upper() == "FSDP" else None
    if not isinstance(fsdp, dict) or str(fsdp.get("fsdp_version", 1)) != "2":
        return
    if str(fsdp.get("fsdp_cpu_ram_efficient_loading", "")).lower() == "true":
        diag.add(
            "warning",
            "fsdp2-ram-efficient-loading",
            "fsdp_cpu_ram_efficient_loading: true with fsdp_version 2 crashes on models with BatchNorm (resnet18, "
            "tv_resnet18): FSDP2 leaves buffers as plain tensors and accelerate reads .device_mesh from them "
            "(accelerate issue #3898). Set fsdp_cpu_ram_efficient_loading: false",
        )


def add_traps(cfg: dict[str, Any], plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """Every trap of ``plan``, as findings in ``diag``."""
    for check in (
        _one_process_launchers,
        _use_cpu_ignored,
        _too_few_gpu_ids,
        _gpu_types_without_gpu,
        _fp16_on_cpu,
        _fp8_unavailable,
        _too_many_processes,
        _gpu_ids_vs_machine,
    ):
        check(plan, env, diag)
    _port_in_use(plan, env, diag, cfg)
    _single_process_notes(plan, env, diag)
    _multi_machine(plan, env, diag, cfg)
    _fsdp2_ram_efficient_loading(cfg, diag)
