"""The one place that builds the ``Accelerator`` and knows about ranks and devices.

It also owns what Accelerate does not do for us (measured with accelerate
1.15 / torch 2.14):

* a ``MULTI_CPU`` config without mpirun silently starts ONE process;
* a ``MULTI_GPU`` config without CUDA starts N independent rank-0 copies
  unless the process asks for CPU; under torchrun ``Accelerator(cpu=True)``
  gives real gloo DDP, which is what ``multi_cpu.yaml`` relies on;
* one process that sees several GPUs is never wrapped in ``nn.DataParallel``;
* fp16 on CPU is silently ignored;
* threads: N processes on one machine must share its cores, and other work's cores are not free (cpu_load.py).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn as nn

from accel_train.accelerate_env import check_accelerate_env
from accel_train.cpu_load import ThreadChoice, allowed_cpus, busy_cores, choose_threads
from accel_train.elastic import launched_world_size, relaunch_as_ranks
from accel_train.errors import LaunchError
from accel_train.netif import choose_socket_ifname, spans_machines
from accel_train.peers import join_bounded, watch

if TYPE_CHECKING:
    from accelerate import Accelerator

log = logging.getLogger("accel_train")


class RuntimeSettings(Protocol):
    """What :func:`build_runtime` reads beyond the launcher's environment (``TrainConfig`` has these fields;
    the runtime never sees the rest of the config)."""

    mixed_precision: str | None
    threads: int | None
    dist_timeout: float
    compile: bool


def check_launch(env: dict[str, str] | os._Environ = os.environ) -> None:
    """Refuse the silent 'MULTI_CPU config started one process' trap.

    accelerate's simple launcher (used for MULTI_CPU and use_cpu configs) sets
    MASTER_ADDR/MASTER_PORT only when the config asked for more than one
    process or machine; without mpirun it then starts a single, lonely process.
    """
    asked_for_many = env.get("ACCELERATE_USE_CPU") is not None and env.get("MASTER_PORT") is not None
    if asked_for_many and launched_world_size(env) == 1:
        raise LaunchError(
            "the accelerate config asked for several CPU processes (distributed_type MULTI_CPU, or 'NO' with "
            "num_processes > 1; an unquoted NO in a wizard's YAML is read as false and ends here too: write 'NO') "
            "but accelerate started only one, because mpirun is not set up. Use accelerate_configs/multi_cpu.yaml "
            "(torchrun-based gloo DDP), or set num_processes: 1; scripts/doctor.py --config_file FILE names the cause"
        )


def wants_cpu_ranks(env: dict[str, str] | os._Environ = os.environ, cuda_available: bool | None = None) -> bool:
    """Several torchrun ranks but no CUDA: they must join a gloo group on CPU.

    Without this each rank would believe it is rank 0 and train alone.
    """
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return launched_world_size(env) > 1 and not cuda_available


_GROUPS_JOINED: list[str] = []  # the process groups this process has joined (one per run)


def init_process_group_per_attempt(cpu: bool, timeout: timedelta) -> None:
    """Join the process group through a store namespace unique to this launcher attempt.

    After ``accelerate launch --max_restarts`` restarts the ranks, torchrun's store
    still holds the previous attempt's keys; gloo could read a dead peer's
    address from them and fail with "connectFullMesh ... Connection refused"
    (seen here under load), or hang. Accelerate skips its own init when a group exists. A script that trains
    twice (two ``accel_train.train`` calls) joins a new group each time, under a namespace of its own too: the
    first group's keys would otherwise send gloo to the first group's closed sockets.
    """
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or launched_world_size() < 2 or dist.is_initialized():
        return
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    _GROUPS_JOINED.append(attempt)  # every rank runs the same calls: the same count on each
    store = dist.PrefixStore(f"accel_train/attempt_{attempt}/group_{len(_GROUPS_JOINED)}", store)
    backend = "gloo"
    device_id = None
    if not cpu and torch.cuda.is_available():
        device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device_id)
        backend = "nccl"  # bound to its device: eager NCCL init, no guessing of the rank's GPU

    def init() -> None:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
        )

    if not spans_machines():
        init()
        return
    choose_socket_ifname(nccl=backend == "nccl")  # where the hostname resolves to loopback (netif.py)
    join_bounded(store, rank, world_size, init, nccl=backend == "nccl")  # no rank waits for a peer that failed


def gpus_hidden_on_purpose(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """``CUDA_VISIBLE_DEVICES`` empty or starting with a negative id (multi_cpu.yaml's '-1,-1')."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and (visible.strip() == "" or visible.strip().startswith("-"))


def should_use_data_parallel(distributed_type: str, device_type: str, cuda_device_count: int) -> bool:
    """The DataParallel-like setup: ONE non-distributed process that sees several GPUs."""
    return str(distributed_type).endswith("NO") and device_type == "cuda" and cuda_device_count > 1


def fp16_ignored(mixed_precision: str | None, device_type: str) -> bool:
    """accelerate silently trains in fp32 when fp16 is asked for on CPU."""
    return mixed_precision == "fp16" and device_type == "cpu"


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The kernel's CPU flags (``/proc/cpuinfo``, or the text given); None where there is no such file."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read(1 << 20)
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def cpu_bf16_kind(cpuinfo: str | None = None) -> str:
    """What this CPU has for bf16 matmuls: ``amx`` (tile units: bf16 GEMM several times fp32), ``avx512_bf16``
    (bf16 dot-product instructions only: faster than fp32 on some CPUs, slower on others, see ``BF16_ON_CPU``),
    ``none`` (bf16 is emulated), or ``unknown`` (no /proc/cpuinfo, e.g. macOS). Read from the kernel's CPU
    flags; no measurement."""
    flags = cpu_flags(cpuinfo)
    if not flags:
        return "unknown"
    if "amx_bf16" in flags:
        return "amx"
    return "avx512_bf16" if "avx512_bf16" in flags else "none"


BF16_ON_CPU = {  # the figures: python -m benchmarks, resnet18 bf16 vs fp32 samples/s (docs/performance.md)
    "amx": "this CPU has AMX: bf16 matmuls run several times faster than fp32",
    "avx512_bf16": "this CPU has AVX512-BF16 but no AMX: bf16 can go either way (resnet18 ran 1.6x fp32 on an "
    "AMD EPYC, 0.74x on an Intel Xeon); measure it here with python -m benchmarks --setups cpu_fp32,cpu_bf16",
    "none": "this CPU has no bf16 instructions: bf16 is emulated and slower than fp32; prefer fp32",
    "unknown": "cannot tell whether this CPU runs bf16 faster than fp32 (no /proc/cpuinfo)",
}


def bf16_cpu_note(mixed_precision: str | None, device_type: str, kind: str | None = None) -> str | None:
    """One line for the run header and the doctor when bf16 runs on a CPU; None otherwise."""
    if mixed_precision != "bf16" or device_type != "cpu":
        return None
    return BF16_ON_CPU[kind or cpu_bf16_kind()]


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _UnderAutocast:
    """One DataParallel replica, called under autocast with the run's dtype (in the replica's thread)."""

    def __init__(self, replica: nn.Module, dtype: torch.dtype):
        self.replica, self.dtype = replica, dtype

    def __call__(self, *args, **kwargs):
        device_type = next((p.device.type for p in self.replica.parameters()), "cuda")
        with torch.autocast(device_type, dtype=self.dtype, enabled=torch.is_autocast_enabled(device_type)):
            return self.replica(*args, **kwargs)


class AutocastDataParallel(nn.DataParallel):
    """``nn.DataParallel`` whose replicas compute in the accelerator's autocast dtype.

    torch's ``parallel_apply`` re-enters autocast in each replica thread without
    passing the dtype, so the thread's default applies: fp16 on CUDA, and a bf16
    run would silently compute in fp16 with no loss scaler. Each replica is
    called under ``torch.autocast(dtype=autocast_dtype)`` inside its thread; the
    wrapper adds no parameters, so state dicts are those of ``nn.DataParallel``.
    """

    def __init__(self, module: nn.Module, device_ids: list[int], autocast_dtype: torch.dtype | None = None):
        super().__init__(module, device_ids=device_ids)
        self.autocast_dtype = autocast_dtype

    def parallel_apply(self, replicas, inputs, kwargs):
        if self.autocast_dtype is not None:
            replicas = [_UnderAutocast(r, self.autocast_dtype) for r in replicas]
        return super().parallel_apply(replicas, inputs, kwargs)


def wrap_data_parallel(
    model: nn.Module, cuda_device_count: int, autocast_dtype: torch.dtype | None = None
) -> nn.Module:
    """Wrap in ``nn.DataParallel`` over every visible GPU (the seeds' recipe).

    Visible devices are renumbered from 0 (``CUDA_VISIBLE_DEVICES``), so the
    model on ``cuda:0`` is always ``device_ids[0]``; checkpoints are written
    from the unwrapped module and never carry ``module.``. ``autocast_dtype``
    (bf16/fp16 runs) is the dtype every replica computes in.
    """
    return AutocastDataParallel(model, list(range(cuda_device_count)), autocast_dtype)


def check_gpu_count(env: dict[str, str] | os._Environ = os.environ, cuda_count: int | None = None) -> None:
    """More GPU processes on this machine than GPUs: one clear line instead of "invalid device ordinal"."""
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local = local_world_size(env)
    if cuda_count and local > cuda_count and "LOCAL_RANK" in env:
        raise LaunchError(
            f"the accelerate config starts {local} processes on this machine but it has {cuda_count} GPU(s); "
            f"pass --num_processes {cuda_count} to accelerate launch (times the number of machines), "
            "or set num_processes in the config"
        )


@dataclass(frozen=True)
class Backends:
    """What :func:`configure_backends` chose for this process (recorded in the run's resolved config)."""

    tf32: bool
    cudnn_benchmark: bool
    channels_last: bool


def configure_backends(
    device: torch.device, mixed_precision: str | None, tf32: bool, channels_last: bool | None, conv_model: bool
) -> Backends:
    """CUDA settings a run wants: TF32 for fp32 matmuls and convolutions on Ampere+ (unless ``tf32`` is False),
    ``cudnn.benchmark`` (the image loaders give fixed shapes; off when deterministic algorithms are asked for),
    and channels_last (``None``: on for conv models under bf16/fp16 on CUDA, where tensor cores want NHWC).
    On other devices only ``channels_last`` is decided, and nothing global changes."""
    cuda = device.type == "cuda"
    if channels_last is None:
        channels_last = cuda and conv_model and mixed_precision in ("bf16", "fp16")
    if not cuda:
        return Backends(tf32=False, cudnn_benchmark=False, channels_last=channels_last)
    overridden = os.environ.get("NVIDIA_TF32_OVERRIDE") == "0"  # the driver's switch wins over torch's flags
    use_tf32 = tf32 and not overridden and torch.cuda.get_device_capability(device)[0] >= 8
    torch.backends.cuda.matmul.allow_tf32 = use_tf32
    torch.backends.cudnn.allow_tf32 = use_tf32  # (cuDNN's own default is on: --no-tf32 must turn it off)
    benchmark = not (torch.are_deterministic_algorithms_enabled() or torch.backends.cudnn.deterministic)
    torch.backends.cudnn.benchmark = benchmark
    return Backends(tf32=use_tf32, cudnn_benchmark=benchmark, channels_last=channels_last)


def check_fsdp_batchnorm(
    distributed_type: str, mixed_precision: str | None, device_type: str, channels_last: bool, model: nn.Module
) -> None:
    """FSDP in bf16/fp16 with BatchNorm in NCHW: one line instead of CUDA's error in the first backward.

    accelerate's FSDP2 mixed-precision policy casts every parameter, BatchNorm's weight and bias too, to the
    half type while the running statistics (buffers) stay fp32, and CUDA's NCHW batch-norm backward refuses
    the mix ("Expected running_mean to have type BFloat16"; torchtitan #674). channels_last (the default for
    conv models in bf16/fp16) takes a kernel that accepts it.
    """
    half = mixed_precision in ("bf16", "fp16")
    if not (str(distributed_type).endswith("FSDP") and half and device_type == "cuda" and not channels_last):
        return
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise LaunchError(
            f"FSDP in {mixed_precision} casts BatchNorm's weights to {mixed_precision} while its running statistics "
            "stay fp32, which CUDA's NCHW batch norm refuses; drop --no-channels-last (channels_last works), or "
            "train this model in fp32 (--mixed-precision no)"
        )


def local_world_size(env: dict[str, str] | os._Environ = os.environ) -> int:
    return int(env.get("LOCAL_WORLD_SIZE") or 1)


def available_cores() -> int:
    return len(allowed_cpus())


def configure_threads(requested: int | None, busy: Callable[[], float | None] = busy_cores) -> ThreadChoice:
    """Set torch's threads by ``cpu_load.choose_threads``: ``--threads``, else this machine's cores split between
    its processes, a lone process leaving out the cores other work keeps busy (``busy`` measures them; only asked
    then). A huge ``--threads`` is capped with a warning: it made thread creation fail in native code, a segfault.
    """
    cores, local = available_cores(), local_world_size()
    choice = choose_threads(requested, cores, local, busy() if not requested and local == 1 else None)
    if requested and requested > cores and os.environ.get("RANK", "0") == "0":
        print(
            f"warning: --threads {requested} is more than the {cores} core(s) this process may use; using {cores}",
            file=sys.stderr,
            flush=True,
        )
    torch.set_num_threads(choice.threads)
    return choice


@dataclass
class Runtime:
    accelerator: Accelerator
    threads: int
    threads_why: str = ""  # the start line's reason for ``threads`` (cpu_load.choose_threads)
    data_parallel: bool = False
    deterministic_before: bool | None = None  # --bitwise: torch's setting before this run (restored by end())

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    def print(self, *args, **kwargs) -> None:
        self.accelerator.print(*args, **kwargs)

    def warn(self, message: str) -> None:
        if self.accelerator.is_main_process:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Wrap in ``nn.DataParallel`` when one process sees several GPUs; call before ``accelerator.prepare``."""
        acc = self.accelerator
        if should_use_data_parallel(acc.distributed_type, acc.device.type, torch.cuda.device_count()):
            # Wrapped before prepare: accelerate's autocast covers the wrapper's forward on this thread,
            # AutocastDataParallel gives each replica thread the same dtype.
            self.data_parallel = True
            dtype = AUTOCAST_DTYPES.get(str(acc.mixed_precision))
            model = wrap_data_parallel(model.to(acc.device), torch.cuda.device_count(), dtype)
            self.print(
                f"DataParallel: one process sees {torch.cuda.device_count()} GPUs; splitting each batch across "
                "them (nn.DataParallel). Multi-process DDP (multi_gpu.yaml) is faster and preferred."
            )
        return model

    def end(self) -> None:
        """Barrier, finish trackers, destroy the process group (see also ``finish_process``)."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
        if self.deterministic_before is not None:
            torch.use_deterministic_algorithms(self.deterministic_before)


def _cache_per_step_package_lookups() -> None:
    """accelerate's ``AcceleratedOptimizer.step`` asks ``is_lomo_available()`` twice per step, and each ask is a
    package-metadata lookup (about 460 us per step here, the size of a small model's whole GPU step). Installed
    packages do not change during a run, so the answer is cached for the process. Idempotent."""
    import accelerate.optimizer

    check = accelerate.optimizer.is_lomo_available
    if not hasattr(check, "cache_info"):
        accelerate.optimizer.is_lomo_available = functools.cache(check)


def _forget_the_previous_run() -> None:
    """A second run in one Python session (``accel_train.train`` twice in a notebook, in-process tests) is a new
    run. accelerate keeps its state per process and refuses another mixed precision in a later ``Accelerator``
    ("restart your runtime"), so the previous run's precision and accumulation state are cleared first (with
    accelerate's own reset). The process group and device (``PartialState``) stay: they belong to the process."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()


def build_runtime(
    cfg: RuntimeSettings, log_with: list | None = None, project_dir: str | os.PathLike | None = None
) -> Runtime:
    """Build THE Accelerator for this process from the launcher's environment and ``cfg``.

    ``project_dir``: the run folder (trackers write there); ``log_with``: ``tracking.trackers_for``'s list."""
    from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
    from accelerate.utils import ProjectConfiguration, TorchDynamoPlugin

    env_precision = check_accelerate_env()  # one line for a value accelerate would misread or fail on
    _cache_per_step_package_lookups()

    relaunch_as_ranks()  # a MULTI_CPU config's lone process becomes the launcher of its N ranks (execve)
    check_launch()  # the MULTI_CPU cases it cannot start (several machines, no accelerate parent)
    check_gpu_count()
    watch_launcher()
    cpu = wants_cpu_ranks()
    bitwise = getattr(cfg, "bitwise", False)  # one thread everywhere: a kernel's sums depend on the thread count
    threads = ThreadChoice(configure_threads(1).threads, "--bitwise") if bitwise else configure_threads(cfg.threads)
    timeout = timedelta(seconds=cfg.dist_timeout)
    init_process_group_per_attempt(cpu, timeout)
    _forget_the_previous_run()
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=cfg.mixed_precision or env_precision,  # explicit: accelerate reads the variable unchecked
        gradient_accumulation_steps=1,  # set by the loop once the batch plan is known
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=project_dir, logging_dir=project_dir),
        # Our sampler shuffles from (seed, epoch); accelerate only shards its batches.
        # non_blocking: pinned host batches are copied to the GPU without waiting for the previous step
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False, even_batches=True, non_blocking=True),
        # torch.compile runs inside prepare, after DDP wrapping (torch's order: compile the DDP module, so the
        # compiler splits graphs at bucket boundaries and overlaps the all-reduce with backward)
        dynamo_plugin=TorchDynamoPlugin(backend="inductor") if cfg.compile else None,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)],
    )
    runtime = Runtime(accelerator, threads.threads, threads.why)
    if bitwise:
        runtime.deterministic_before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
    if cpu and not gpus_hidden_on_purpose():
        runtime.warn(
            f"the accelerate config asked for {accelerator.num_processes} GPU processes but this machine has no "
            "CUDA device; training with gloo DDP on CPU instead. Use accelerate_configs/multi_cpu.yaml to mean it."
        )
    if fp16_ignored(accelerator.mixed_precision, accelerator.device.type):
        runtime.warn("fp16 mixed precision is ignored on CPU (accelerate trains in fp32); use bf16, which works on CPU")
    return runtime


ORPHAN_POLL_S = 0.5


def watch_launcher(env: dict[str, str] | os._Environ = os.environ, poll_s: float = ORPHAN_POLL_S) -> bool:
    """Leave when the launcher that started this worker is gone (it was killed, e.g. with SIGKILL).

    torchrun's workers are its children; killed launchers leave them re-parented to
    PID 1, training and writing checkpoints for nobody. A daemon thread compares
    the parent PID with the one at start and exits the process once it changes,
    after the write in progress (a metrics line, a checkpoint rename) is whole;
    checkpoints are atomic, so a save cut short is ignored by ``--resume auto``.
    Only under torchrun: a plain ``python train.py`` may outlive its shell on purpose.
    """
    if "TORCHELASTIC_RUN_ID" not in env:
        return False

    launcher = os.getppid()

    def gone() -> tuple[str, int] | None:
        if os.getppid() == launcher:
            return None
        return (
            f"[rank {env.get('RANK', '0')}] error: the launcher (pid {launcher}) is gone; exiting (the last "
            "complete checkpoint is intact: continue with --resume auto)",
            1,
        )

    watch(gone, "accel_train-orphan-watch", poll_s=poll_s)
    return True


def ignore_stop_signals() -> None:
    """This process is on its way out because another process of the run is gone (``errors.peer_lost``): the
    launcher's SIGTERM, sent because of that same loss (torchrun: once it sees the dead rank), must not replace
    the one line and exit code 4 it is about to give; SIGTERM's default action would end it as -15 with no line
    (SIGINT: "interrupted", 130). Only a slow way out meets that signal, so a loaded machine's; a way out that
    hangs still ends with the launcher's SIGKILL (torchrun's, 30 s later). Main thread only."""
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)


def finish_process(exit_code: int = 0) -> None:
    """Leave a multi-process run without interpreter finalisation.

    Root cause of the gloo teardown SIGABRT ("terminate called without an active
    exception", about 1 run in 10 here), read from a core dump: while the main
    thread runs ``Py_FinalizeEx``, a gloo worker thread (``ProcessGroupGloo::runLoop``)
    destroys the last barrier's work object, whose thread-local state holds a
    Python object. Releasing it takes the GIL; during finalisation CPython answers
    with ``pthread_exit``, and the forced unwind through a ``noexcept`` C++
    destructor calls ``std::terminate``. ``destroy_process_group()`` does not join
    those threads, so the only robust exit skips finalisation. Everything the run
    writes is closed and flushed before this point.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exit_code)
