"""What train.py makes of the processes accelerate starts: world size, device, backend, distributed type.

Each answer comes from the predicates train.py itself runs (``runtime.py``, ``elastic.py``), applied to
the environment accelerate prepared (``LaunchPlan.launched_env``) plus what the launcher adds per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel_train.doctor.environment import Environment, parse_visible_devices

if TYPE_CHECKING:
    from accel_train.doctor.plan import LaunchPlan


def _visible_gpus(rank_env: dict[str, str], env: Environment) -> int:
    """GPUs a process sees: the machine's when CUDA_VISIBLE_DEVICES is inherited, else the listed ones that exist."""
    visible = rank_env.get("CUDA_VISIBLE_DEVICES")
    if visible == env.cuda_visible_devices:
        return env.cuda_device_count
    ids = parse_visible_devices(visible) or []
    physical = env.physical_gpus
    if physical is None:
        return len(ids)
    n_gpus = 0
    for gid in ids:
        if not isinstance(gid, int) or gid >= physical:
            break
        n_gpus += 1
    return n_gpus


def _processes(plan: LaunchPlan) -> dict[str, str]:
    """How many processes start, and the environment of rank 0 (what train.py's runtime reads)."""
    from accel_train import elastic, runtime
    from accel_train.errors import LaunchError

    args, rank_env = plan.args, dict(plan.launched_env)
    machines = max(int(args.num_machines or 1), 1)
    if plan.launcher in ("torchrun", "deepspeed"):
        plan.per_machine = int(getattr(args, "nproc_per_node", None) or args.num_processes // machines)
        plan.world_size = plan.per_machine * machines
        ranks = {"WORLD_SIZE": str(plan.world_size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(plan.per_machine)}
        return {**rank_env, **ranks}
    if plan.launcher == "mpirun":
        plan.per_machine, plan.world_size = args.num_processes // machines, args.num_processes
        return {**rank_env, "OMPI_COMM_WORLD_SIZE": str(plan.world_size)}
    if plan.launcher != "simple" or not elastic.started_alone_by_simple_launcher(rank_env):
        return rank_env
    request = elastic.requested(elastic.parse_launch_args(plan.argv))
    if elastic.can_start_ranks(request):
        plan.relaunch, plan.per_machine, plan.world_size = True, request.num_processes, request.num_processes
        ranks = {"WORLD_SIZE": str(plan.world_size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(plan.world_size)}
        return {**elastic.ranks_env(rank_env), **ranks}
    try:
        runtime.check_launch(rank_env)
    except LaunchError as refusal:
        plan.refusal = str(refusal)
    return rank_env


def rank_side(plan: LaunchPlan, env: Environment) -> None:
    """What train.py's runtime makes of the launch: world size, device, backend, distributed type, DataParallel.

    The distributed type and backend follow accelerate's ``PartialState._prepare_backend`` and the
    overrides in ``AcceleratorState.__init__`` (FSDP, DeepSpeed, Megatron-LM from the launcher's variables).
    """
    import torch.distributed as dist
    from accelerate.utils import str_to_bool

    from accel_train.runtime import should_use_data_parallel, wants_cpu_ranks

    plan.rank_env = rank_env = _processes(plan)
    plan.n_gpus = _visible_gpus(rank_env, env)
    # Accelerator(cpu=...): ACCELERATE_USE_CPU from the simple launcher, or train.py's gloo ranks
    cpu = bool(str_to_bool(rank_env.get("ACCELERATE_USE_CPU", "false"))) or wants_cpu_ranks(rank_env, plan.n_gpus > 0)
    plan.device = "xla" if plan.launcher == "xla" else "cpu" if cpu or plan.n_gpus == 0 else "cuda"
    if not cpu and plan.device == "cuda" and "LOCAL_RANK" in rank_env:
        plan.run_dt, plan.backend = "MULTI_GPU", "nccl"
    elif cpu and ("LOCAL_RANK" in rank_env or plan.world_size > 1):
        # under torchrun train.py joins gloo itself (runtime.init_process_group_per_attempt); mpirun: accelerate
        mpi = plan.launcher == "mpirun" and dist.is_mpi_available()
        plan.run_dt, plan.backend = "MULTI_CPU", "mpi" if mpi else "gloo"
    for var, dt in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_MEGATRON_LM", "MEGATRON_LM")):
        if plan.run_dt == "MULTI_GPU" and rank_env.get(var, "").lower() == "true":
            plan.run_dt = dt
    if rank_env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not cpu:
        plan.run_dt = "DEEPSPEED"
    plan.data_parallel = should_use_data_parallel(plan.run_dt, plan.device, plan.n_gpus)


def run_mixed_precision(plan: LaunchPlan) -> str:
    """``accelerator.mixed_precision`` in the run: the launcher's, except that DeepSpeed reports 'no' (not fp8)."""
    mp = plan.rank_env.get("ACCELERATE_MIXED_PRECISION", plan.mp).lower()
    return "no" if plan.run_dt == "DEEPSPEED" and mp != "fp8" else mp
