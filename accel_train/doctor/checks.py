"""The traps a launch plan falls into, one function each, in the order the report lists them.

accelerate itself refuses some configs before starting anything (``refused``); the other traps are
ones it lets through. Where train.py decides (relaunching MULTI_CPU ranks, refusing a lone process,
gloo on CPU, DataParallel, fp16 on CPU, too many processes for the GPUs) the check asks
``runtime.py``'s own predicates, applied to the environment accelerate prepared (``plan.rank_env``).
"""

from __future__ import annotations

from typing import Any

from accel_train.doctor.configfile import CUDA_TYPES, MULTI_CONFIG, Diagnosis, _plural
from accel_train.doctor.environment import Environment, parse_visible_devices
from accel_train.doctor.plan import LaunchPlan, Refused
from accel_train.netif import Route, is_address, is_loopback, user_socket_ifname
from accel_train.runtime import bf16_cpu_note, fp16_ignored, gpus_hidden_on_purpose, wants_cpu_ranks


def refused(refusal: Refused, cfg: dict[str, Any], diag: Diagnosis) -> None:
    """accelerate launch stops before starting anything: say why, with the fix."""
    message = str(refusal)
    gpu_ids = str(cfg.get("gpu_ids"))
    if "Less than two GPU ids" in message:
        if parse_visible_devices(gpu_ids) == []:
            fix = "to hide every GPU write gpu_ids: '-1,-1' (CUDA still sees none, accelerate sees two ids)"
        else:
            fix = "list at least two GPUs, use gpu_ids: 'all', or for one GPU use distributed_type: 'NO'"
        code = "too-few-gpu-ids"
        message = (
            f"distributed_type {cfg.get('distributed_type')} on one machine with gpu_ids {gpu_ids!r}: accelerate "
            f"launch refuses it ('Less than two GPU ids were configured'); {fix}"
        )
    elif "manually pass in `--num_processes`" in message:
        code = "num-processes-missing"
        message = (
            f"distributed_type {cfg.get('distributed_type')} without num_processes: accelerate launch stops with "
            "'You need to manually pass in --num_processes'; add num_processes: N"
        )
    elif "main process IP" in message or "main process port" in message:
        key = "main_process_ip" if "IP" in message else "main_process_port"
        code = key.replace("_", "-") + "-missing"
        message = f"the simple launcher needs {key} when num_machines > 1 (accelerate asserts it); set {key}"
    else:
        code, message = "launch-refused", f"accelerate launch stops before starting anything: {message}"
    diag.add("error", code, message)


def _one_process_launchers(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    n = plan.args.num_processes
    if plan.relaunch:
        diag.add(
            "info",
            "multi-cpu-relaunched",
            f"accelerate's simple launcher starts ONE process for {n} CPU processes (no mpirun); train.py "
            f"starts the {n} ranks itself (torch elastic launcher, gloo DDP on CPU), as {MULTI_CONFIG} does",
        )
    elif plan.refusal and plan.dt == "MULTI_CPU" and not plan.cpu_flag:
        reason = "mpirun is not installed" if not env.mpirun_available else "no mpirun_config.mpirun_hostfile is set"
        diag.add(
            "error",
            "multi-cpu-one-process",
            f"distributed_type MULTI_CPU with num_processes {n}: accelerate uses its simple launcher "
            f"because {reason}, so only ONE process would start per machine, and train.py starts the ranks "
            f"itself only on one machine (here it refuses to run). For gloo DDP on CPU "
            f"use {MULTI_CONFIG} (torchrun with GPUs hidden), or set num_processes: 1",
        )
    elif plan.refusal:
        why = "accelerate launch --cpu always uses" if plan.cpu_flag else f"distributed_type {plan.dt} uses"
        diag.add(
            "error",
            "cpu-flag-one-process" if plan.cpu_flag else "num-processes-ignored",
            f"{why} the simple launcher: ONE process starts for num_processes {n}, and train.py refuses to run "
            f"alone. Set num_processes: 1, or for several processes use MULTI_GPU ({MULTI_CONFIG} on CPU)",
        )


def _launcher_missing(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """The launcher accelerate picked is not installed (the doctor's dry run does not start it)."""
    from accelerate.utils import is_deepspeed_available

    if plan.launcher == "mpirun" and not env.mpirun_available:
        diag.add(
            "error",
            "mpirun-missing",
            f"mpirun_config.mpirun_hostfile is set ({plan.args.mpirun_hostfile}) but neither mpirun nor mpiexec "
            f"is installed; accelerate launch fails. Install MPI or use {MULTI_CONFIG}",
        )
    if plan.launcher == "deepspeed" and not is_deepspeed_available():
        diag.add(
            "error",
            "deepspeed-missing",
            "distributed_type DEEPSPEED but DeepSpeed is not installed: accelerate launch stops with an "
            "ImportError. pip install deepspeed, or use MULTI_GPU or FSDP",
        )


def _use_cpu_ignored(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """use_cpu reaches the processes only as the simple launcher's ACCELERATE_USE_CPU."""
    if not plan.args.use_cpu or "ACCELERATE_USE_CPU" in plan.launched_env or plan.launcher == "xla":
        return
    if plan.n_gpus > 0:
        diag.add(
            "warning",
            "use-cpu-ignored",
            f"use_cpu: true is ignored by the {plan.launcher} launcher (accelerate only passes it to the simple "
            f"launcher): the {plan.per_machine} processes will use the GPUs. To train on CPU hide the GPUs "
            f"({MULTI_CONFIG}: gpu_ids '-1,-1')",
        )
    else:
        diag.add("info", "use-cpu-ignored", f"use_cpu: true has no effect with the {plan.launcher} launcher")


def _gpu_types_without_gpu(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """train.py's gloo fallback (``wants_cpu_ranks``) and its warning unless ``gpus_hidden_on_purpose``."""
    if plan.launcher not in ("torchrun", "deepspeed") or not wants_cpu_ranks(plan.rank_env, plan.n_gpus > 0):
        return
    if not gpus_hidden_on_purpose(plan.rank_env):
        other = plan.dt in CUDA_TYPES and plan.dt != "MULTI_GPU"
        extra = f" ({plan.dt} itself may not support CPU)" if other else ""
        diag.add(
            "warning",
            "multi-gpu-without-gpu",
            f"distributed_type {plan.dt} but this machine has no CUDA device: torchrun still starts "
            f"{plan.per_machine} processes and train.py falls back to gloo DDP on CPU{extra}. To mean it, use "
            f"{MULTI_CONFIG}",
        )
        return
    if plan.hidden_by_gpu_ids:
        hider = f"gpu_ids {plan.args.gpu_ids!r}"
    else:
        hider = f"CUDA_VISIBLE_DEVICES={plan.cuda_visible_devices!r}"
    diag.add(
        "info",
        "gpus-hidden",
        f"GPUs hidden on purpose by {hider}: torchrun starts {_plural(plan.per_machine, 'rank')} per machine and "
        "train.py joins them in a gloo process group on CPU",
    )


def _fp16_on_cpu(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    if fp16_ignored(plan.mp, plan.device):
        diag.add(
            "warning",
            "fp16-on-cpu",
            "mixed_precision fp16 on CPU is silently ignored by accelerate (training runs in fp32); "
            "use mixed_precision: 'bf16', which works on CPU",
        )


def _bf16_on_cpu(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """Whether bf16 will be faster than fp32 on this CPU (AMX: yes; AVX512-BF16 only: measure; none: slower)."""
    note = bf16_cpu_note(plan.mp, plan.device, env.cpu_bf16)
    if note:
        diag.add("warning" if env.cpu_bf16 == "none" else "info", "bf16-on-cpu", f"mixed_precision bf16: {note}")


def _fp8_unavailable(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """accelerate launch stops with a RuntimeError traceback ('FP8 is not available on this machine')."""
    if plan.mp != "fp8":
        return
    from accelerate.utils import is_fp8_available

    fix = "use mixed_precision: 'bf16' (it works on CPU too) or 'no'"
    if plan.device != "cuda":
        diag.add(
            "error",
            "fp8-unavailable",
            f"mixed_precision fp8 needs a CUDA GPU (Ada/Hopper or newer) and Transformer Engine, MS-AMP or torchao; "
            f"this plan runs on {plan.device}, where accelerate launch or the run fails; {fix}",
        )
    elif not is_fp8_available():
        diag.add(
            "error",
            "fp8-unavailable",
            "mixed_precision fp8 needs Transformer Engine, MS-AMP or torchao and none is installed: accelerate "
            f"launch stops with 'FP8 is not available on this machine'; install one, or {fix}",
        )


def _too_many_processes(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    from accel_train.errors import LaunchError
    from accel_train.runtime import check_gpu_count

    if plan.device == "cuda":
        try:
            check_gpu_count(plan.rank_env, plan.n_gpus)  # what each rank checks first
        except LaunchError as exc:
            diag.add("error", "too-many-processes", f"{exc} (each process takes cuda:LOCAL_RANK)")
    elif plan.device == "cpu" and plan.per_machine > env.cpu_count:
        diag.add(
            "warning",
            "too-many-processes",
            f"{plan.per_machine} CPU processes per machine but only {_plural(env.cpu_count, 'core')}: "
            "they will oversubscribe the CPU and run slower than fewer processes",
        )


def _gpu_ids_vs_machine(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    physical, ids, gpu_ids = env.physical_gpus, plan.gpu_ids_list, plan.args.gpu_ids
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
    if ids and env.cuda_visible_devices is not None and ids != parse_visible_devices(env.cuda_visible_devices):
        diag.add(
            "warning",
            "gpu-ids-override-cvd",
            f"CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r} is set but accelerate replaces it with gpu_ids "
            f"{gpu_ids!r}: the processes see physical GPUs {gpu_ids}, renumbered from 0. To keep your "
            "selection, drop gpu_ids (or set gpu_ids: 'all')",
        )


def _port_in_use(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """accelerate's own port check (torchrun, DeepSpeed); mpirun's ranks meet on MASTER_PORT unchecked."""
    port, busy = plan.args.main_process_port, plan.port_busy
    if plan.launcher == "mpirun" and plan.launched_env.get("MASTER_PORT") and plan.args.machine_rank == 0:
        port = int(plan.launched_env["MASTER_PORT"])
        busy = env.port_in_use(port)
    if not busy:
        return
    if plan.args.num_machines <= 1 and plan.launcher != "mpirun":
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
        diag.add("info", "no-gpu", f"gpu_ids {plan.args.gpu_ids!r} but no CUDA device here: runs on CPU")


def _multi_machine(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    args = plan.args
    machines, rank, n = args.num_machines, args.machine_rank, args.num_processes
    if machines <= 1:
        return
    if not args.main_process_ip:  # the simple launcher asserts it; torchrun would wait for host "None"
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


def _socket_interface(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """Several machines: the interface that reaches main_process_ip, which train.py gives gloo/NCCL (netif.py)."""
    ip = plan.args.main_process_ip
    if plan.args.num_machines <= 1 or not ip or env.route_to is None:
        return
    route = env.route_to(str(ip))
    if route is None:
        diag.add(
            "warning",
            "main-process-ip-unreachable",
            f"main_process_ip {ip} does not resolve, or this machine has no route to it: the launch would wait for "
            "the main machine's rendezvous until it times out. Set main_process_ip to the main machine's address "
            "as the other machines reach it",
        )
        return
    if route.loopback and not is_address(str(ip)):
        diag.add(
            "warning",
            "main-process-ip-loopback-name",
            f"main_process_ip {ip} resolves to the loopback address {route.source} on this machine (/etc/hosts), "
            "but the other machines reach it elsewhere: gloo and NCCL here would announce a loopback address. "
            "Set main_process_ip to the main machine's address, or GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to the "
            "interface the other machines reach it on",
        )
        return
    if route.loopback:
        diag.add(
            "info",
            "main-process-ip-loopback",
            f"main_process_ip {ip} is a loopback address: only processes on this machine reach it (every machine "
            "of this config runs here). For real machines set the main machine's address that all of them reach",
        )
        return
    variables = "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME" if plan.backend == "nccl" else "GLOO_SOCKET_IFNAME"
    user = user_socket_ifname(plan.shell_env)
    via = f"this machine reaches main_process_ip {ip} through interface {route.interface or '?'} ({route.source})"
    if user:
        then = f"you set {user}, which train.py keeps"
    elif route.interface:
        then = f"train.py sets {variables}={route.interface} in each process (set it yourself to choose another)"
    else:
        then = f"train.py cannot name that interface: set {variables} to it yourself"
    diag.add("info", "socket-interface", f"{via}; {then}")
    if not user:
        _hostname_loopback(route, variables, env, diag)


def _hostname_loopback(route: Route, variables: str, env: Environment, diag: Diagnosis) -> None:
    """gloo and NCCL take their address from the hostname: a loopback one cannot be reached from other machines."""
    name, address = env.hostname or ("", None)
    if address is None or not is_loopback(address):
        return
    fix = (
        f"train.py now sets {variables}={route.interface} itself (the interface that reaches main_process_ip)"
        if route.interface
        else f"set {variables} to the interface that reaches main_process_ip"
    )
    diag.add(
        "warning",
        "hostname-loopback",
        f"the hostname {name} resolves to the loopback address {address} (/etc/hosts): gloo and NCCL would "
        f"announce it to the other machines, which cannot connect to it (Gloo connectFullMesh failed ... "
        f"remote=[{address}]); {fix}. To be explicit, set {variables} on each machine, or map {name} to "
        f"{route.source} in /etc/hosts",
    )


def _fsdp2_ram_efficient_loading(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """accelerate issue #3898: FSDP2 + cpu_ram_efficient_loading reads .device_mesh from plain buffers."""
    fsdp = plan.launched_env
    if fsdp.get("FSDP_VERSION") == "2" and fsdp.get("FSDP_CPU_RAM_EFFICIENT_LOADING") == "true":
        diag.add(
            "warning",
            "fsdp2-ram-efficient-loading",
            "fsdp_cpu_ram_efficient_loading: true with fsdp_version 2 crashes on models with BatchNorm (resnet18, "
            "tv_resnet18): FSDP2 leaves buffers as plain tensors and accelerate reads .device_mesh from them "
            "(accelerate issue #3898). Set fsdp_cpu_ram_efficient_loading: false",
        )


def add_traps(plan: LaunchPlan, env: Environment, diag: Diagnosis) -> None:
    """Every trap of ``plan``, as findings in ``diag``."""
    for check in (
        _one_process_launchers,
        _launcher_missing,
        _use_cpu_ignored,
        _gpu_types_without_gpu,
        _fp16_on_cpu,
        _bf16_on_cpu,
        _fp8_unavailable,
        _too_many_processes,
        _gpu_ids_vs_machine,
        _port_in_use,
        _single_process_notes,
        _multi_machine,
        _socket_interface,
        _fsdp2_ram_efficient_loading,
    ):
        check(plan, env, diag)
