"""Benchmark the portable loop on this machine against a hand-written floor.

``python -m benchmarks`` is the command line; everything is measured here:

* **portable loop**: ``scripts/train.py`` launched as users launch it (``python
  scripts/train.py``; ``--mixed-precision bf16`` or ``accelerate launch`` with
  ``cpu_bf16.yaml``; ``accelerate launch`` with ``multi_cpu.yaml`` for 2 gloo
  ranks) on synthetic data of the setup's **workload**: MNIST-shaped 1x28x28 on
  CPU (batch 16-32), CIFAR-shaped 3x32x32 with resnet18 at batch 512 on CUDA
  (``--workload`` overrides). Steady-state ``train_samples_per_s``,
  ``data_wait_fraction`` and ``peak_memory_mb`` come from its ``summary.json``;
  peak RSS (and the TF32 flags in effect) from a tiny wrapper that runs
  ``train.py`` through ``runpy`` and writes them for each rank before the
  process exits.
* **plain loop** (the floor): a hand-written PyTorch loop in a fresh process,
  same model, same synthetic uint8 tensors in memory (pinned per batch on
  CUDA, as accel_train's loader pins), same global batch, same threads, Adam,
  cross-entropy (and the same gradient clipping as the loop's default). Like
  the portable loop it syncs the host only at log points (every
  ``WINDOW_STEPS`` steps, reading its running loss with ``.item()``); the
  per-phase breakdown (data, forward+backward, optimizer and, for DDP,
  gradient synchronisation: ``no_sync`` steps vs synced steps) is host time on
  CPU, and comes from a few extra steps with a device sync after each phase
  on CUDA.
* **CUDA runs** are pinned to ONE GPU (``CUDA_VISIBLE_DEVICES`` set to the
  first visible id in the child's environment): a single process that sees
  several GPUs would otherwise run accel_train's ``nn.DataParallel``. TF32 is
  set the same way (``--no-tf32`` turns it off) for the CUDA GEMM peak, the
  plain loop and the portable loop (through the wrapper), and recorded.
* **bf16 study**: all precision/memory-format variants of a model stepped
  round-robin in ONE process (so machine noise hits them alike), plus a
  profile of where forward+backward time goes.
* **time to accuracy**: launch to 97% test accuracy, ``scripts/train.py``
  defaults vs the seed-000 recipe (per-sample PIL images + ``ToTensor``, a
  DataLoader with 2 workers, a ``.to(device)`` per step, mnist_cnn).
* machine: cores, versions, fp32/bf16 GEMM peak (same threads), load average.

Children are started with ``python -m benchmarks.bench --child KIND SPEC``.
Nothing here asserts a goal: goals are evaluated and reported.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_train.config import TrainConfig
from accel_train.launch import CONFIG_DIR, REPO, accelerate_launch, child_env
from accel_train.run_dir import pid_alive
from accel_train.runs import read_metrics
from accel_train.runtime import available_cores, cpu_bf16_kind, cpu_flags
from accel_train.trainer import WARMUP_STEPS_EXCLUDED
from benchmarks.speedrun import TARGET as TARGET_SPEEDRUN
from benchmarks.speedrun import markdown as speedrun_markdown
from benchmarks.speedrun import run_speedrun

TRAIN_SCRIPT = REPO / "scripts" / "train.py"
MODELS = ("mnist_cnn", "lenet", "resnet18", "tv_resnet18")
STUDY_MODELS = ("mnist_cnn", "resnet18")  # the bf16 investigation
# --quick (without --models/--setups) measures these cells only: every train.py launch costs ~6 s of imports
# and set-up on a 2-core machine, so all 12 cells plus time to accuracy cannot fit in 3 minutes.
QUICK_CELLS = {
    "cpu_fp32": MODELS,  # portable vs plain, every model
    "cpu_bf16": STUDY_MODELS,  # the bf16 question
    "gloo_2proc": ("mnist_cnn", "lenet"),  # DDP scaling on MNIST-sized models
    "cuda_fp32": MODELS,  # only where a GPU is visible
    "cuda_bf16": STUDY_MODELS,
}
WARMUP_STEPS = WARMUP_STEPS_EXCLUDED  # the plain loop excludes the steps the portable loop excludes
WINDOW_STEPS = TrainConfig.log_every  # the default: the portable logs samples/s over such windows
TARGET_ACCURACY = 0.97
SYNTHETIC_SEED = 42  # TrainConfig.seed's default: the portable's synthetic data are generated from it
SYNTHETIC_MEAN, SYNTHETIC_STD = 0.5, 0.25  # accel_train.data.synthetic's normalisation
DEFAULT_LR = 2e-3  # TrainConfig.lr
DEFAULT_CLIP = 1.0  # TrainConfig.max_grad_norm
SEED000_LR, SEED000_BATCH, SEED000_WORKERS = 1e-3, 64, 2
GOAL_RATIO_VS_PLAIN = 0.98
GOAL_DATA_WAIT = 0.05
GOAL_DDP_SCALING = 0.9
GOAL_BF16_SPEEDUP = 2.0  # on CPUs with AMX (issue 12); CPUs without AMX report it as not applicable
GOAL_BF16_MFU = 0.25
GOAL_DEFAULT_RUN_S = 4.0
GOAL_DEFAULT_RUN_ACCURACY = 0.97
GOAL_T2A_SPEEDUP = 5.0
GOAL_HELP_S = 2.0


# --------------------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class Setup:
    """One way of running: processes, precision, memory format, device."""

    name: str
    processes: int
    precision: str  # "fp32" | "bf16"
    channels_last: bool = False
    device: str = "cpu"
    study_only: bool = False  # only for STUDY_MODELS (the bf16 investigation)

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"


SETUPS: tuple[Setup, ...] = (
    Setup("cpu_fp32", 1, "fp32"),
    Setup("cpu_bf16", 1, "bf16"),
    Setup("gloo_2proc", 2, "fp32"),
    Setup("cpu_fp32_cl", 1, "fp32", channels_last=True, study_only=True),
    Setup("cpu_bf16_cl", 1, "bf16", channels_last=True, study_only=True),
)
CUDA_SETUPS: tuple[Setup, ...] = (
    Setup("cuda_fp32", 1, "fp32", device="cuda"),
    Setup("cuda_bf16", 1, "bf16", device="cuda"),
)


@dataclass(frozen=True)
class ModelPlan:
    """Global batch and measured steps (after WARMUP_STEPS) per mode."""

    batch: int
    steps_quick: int
    steps_full: int
    steps_smoke: int = 5


MODEL_PLANS: dict[str, ModelPlan] = {
    "mnist_cnn": ModelPlan(32, 4, 40),
    "lenet": ModelPlan(32, 20, 300),
    "resnet18": ModelPlan(16, 2, 20),  # 28x28 with no stem downsampling: ~2.7 GFLOP/sample
    "tv_resnet18": ModelPlan(32, 4, 50),
}
# GPU-sized: MNIST shapes at batch 16-32 leave a GPU idle between tiny kernels, so their samples/s say nothing.
CIFAR_PLANS: dict[str, ModelPlan] = {
    "resnet18": ModelPlan(512, 40, 200),  # a GPU batch size (issue 12: 512+)
}


@dataclass(frozen=True)
class Workload:
    """The synthetic data (shape) and the models, with their batch and steps, measured on it."""

    name: str
    channels: int
    image_size: int
    plans: dict[str, ModelPlan] = field(hash=False)
    description: str

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.plans)

    def train_args(self) -> list[str]:
        """scripts/train.py flags for this shape (none for train.py's own default, 1x28x28)."""
        if (self.channels, self.image_size) == (1, 28):
            return []
        return ["--synthetic-channels", str(self.channels), "--synthetic-image-size", str(self.image_size)]


WORKLOADS: dict[str, Workload] = {
    "mnist": Workload("mnist", 1, 28, MODEL_PLANS, "synthetic MNIST-shaped 1x28x28 uint8"),
    "cifar": Workload("cifar", 3, 32, CIFAR_PLANS, "synthetic CIFAR-shaped 3x32x32 uint8"),
}
WORKLOAD_CHOICES = ("auto", *WORKLOADS)


def select_workload(device: str, requested: str = "auto") -> Workload:
    """``auto``: the CIFAR-shaped GPU workload where CUDA is the device, the MNIST-shaped one on CPU."""
    if requested == "auto":
        requested = "cifar" if device == "cuda" else "mnist"
    if requested not in WORKLOADS:
        from accel_train.errors import UserError

        raise UserError(f"unknown workload {requested!r}; choose from {', '.join(WORKLOAD_CHOICES)}")
    return WORKLOADS[requested]


@dataclass
class BenchOptions:
    out: Path
    quick: bool = False
    smoke: bool = False  # tiny: lenet, cpu_fp32, a few steps, no time to accuracy, no study (tests)
    data_dir: str | None = None
    models: tuple[str, ...] | None = None
    setups: tuple[str, ...] | None = None
    repeats: int | None = None
    time_to_accuracy: bool = True
    keep_runs: bool = False
    workload: str = "auto"  # auto | mnist | cifar (see select_workload)
    tf32: bool = True  # TF32 for CUDA matmuls AND convolutions: GEMM peak, plain loop and portable loop alike
    speedrun: bool | None = None  # CIFAR-10 time to 94% (benchmarks.speedrun); None: where a GPU is visible
    command: str = "python scripts/benchmark.py"  # how this run was started (in the report and the README block)
    readme: Path | None = None  # write the figures into this README's benchmark block
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def mode(self) -> str:
        return "smoke" if self.smoke else "quick" if self.quick else "full"

    def workload_for(self, setup: Setup) -> Workload:
        return select_workload(setup.device, self.workload)

    def plan(self, setup: Setup, model: str) -> ModelPlan:
        return self.workload_for(setup).plans[model]

    def steps(self, model: str, workload: Workload | None = None) -> int:
        plan = (workload or WORKLOADS["mnist"]).plans[model]
        return {"smoke": plan.steps_smoke, "quick": plan.steps_quick, "full": plan.steps_full}[self.mode]

    def cuda_tf32(self, setup: Setup) -> bool | None:
        """The TF32 setting a run of ``setup`` is given (None on CPU: the flags do not apply there)."""
        return self.tf32 if setup.device == "cuda" else None

    def n_repeats(self) -> int:
        return self.repeats or (2 if self.mode == "full" else 1)


# --------------------------------------------------------------------------- small helpers


def _median(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- precision and device pinning


def precision_flags() -> dict[str, Any]:
    """The fp32 math settings in effect in this process (TF32 applies to CUDA only; CPUs ignore it)."""
    import torch

    return {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def set_tf32(enabled: bool) -> None:
    """The same TF32 choice for matmuls and convolutions.

    PyTorch's defaults differ (matmuls off, cuDNN convolutions on), so an "fp32" GEMM peak
    measured with the defaults is a true-fp32 peak while the model's convolutions run in TF32.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextmanager
def tf32_mode(enabled: bool | None) -> Iterator[None]:
    """``set_tf32(enabled)`` for the block, then the previous settings; ``None`` leaves them alone."""
    import torch

    if enabled is None:
        yield
        return
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    set_tf32(enabled)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


def first_visible_gpu(env: Mapping[str, str] | None = None) -> str:
    """The GPU that ``cuda:0`` is in this process: the first ``CUDA_VISIBLE_DEVICES`` entry, else ``0``."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    first = visible.split(",")[0].strip()
    return first or "0"


def visible_devices(setup: Setup, env: Mapping[str, str] | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a child of ``setup``; None: leave the launcher's choice.

    CPU: no GPU. One CUDA process: exactly ONE GPU (the one this process measures as ``cuda:0``),
    because accel_train wraps a single process that sees several GPUs in ``nn.DataParallel``:
    without the pin a "1-GPU" run on a multi-GPU host silently becomes a DataParallel run.
    """
    if setup.device == "cpu":
        return ""
    if setup.processes == 1:
        return first_visible_gpu(env)
    return None


def one_gpu_env(parent_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``child_env()`` for the time-to-accuracy runs (one process on the default device): at most ONE GPU.

    Without it, ``scripts/train.py`` on a multi-GPU host would run ``nn.DataParallel`` while the
    seed-000 recipe uses one GPU. ``CUDA_VISIBLE_DEVICES=""`` (no GPU) is kept as it is.
    """
    env = child_env()
    if (os.environ if parent_env is None else parent_env).get("CUDA_VISIBLE_DEVICES") != "":
        env["CUDA_VISIBLE_DEVICES"] = first_visible_gpu(parent_env)
    return env


# --------------------------------------------------------------------------- the machine


def cpu_description() -> dict[str, Any]:
    model, text = platform.processor() or platform.machine(), ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    for line in text.splitlines():
        if line.startswith("model name") and ":" in line:
            model = line.split(":", 1)[1].strip()
            break
    flags = cpu_flags(text) or set()
    return {
        "cpu": model,
        "cpu_bf16_kind": cpu_bf16_kind(text),  # the product's own reading (run header, doctor)
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx512f": "avx512f" in flags,
    }


def measure_gemm_peak(
    threads: int, n: int = 2048, reps: int = 5, device: str = "cpu", tf32: bool | None = None
) -> dict[str, Any]:
    """Best-of-``reps`` GFLOP/s of an n x n matmul in fp32 and bf16, interleaved (same noise for both).

    ``tf32`` (CUDA): measured under ``set_tf32(tf32)``, the setting the loops run with, so the
    "fp32" peak is the TF32 tensor-core peak when TF32 is on and the true-fp32 peak when it is off.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tf32_mode(tf32):
            return _gemm_peak(torch, n, reps, device)
    finally:
        torch.set_num_threads(previous)


def _gemm_peak(torch: Any, n: int, reps: int, device: str) -> dict[str, Any]:
    """Best-of-``reps`` n x n matmul seconds per dtype on ``device``, as GFLOP/s."""
    dev = torch.device(device)
    mats = {
        dt: (torch.randn(n, n, device=dev).to(dt), torch.randn(n, n, device=dev).to(dt))
        for dt in (torch.float32, torch.bfloat16)
    }
    best = {dt: float("inf") for dt in mats}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for a, b in mats.values():  # warm-up: kernel selection, page faults
        a @ b
    sync()
    for _ in range(reps):
        for dt, (a, b) in mats.items():
            t0 = time.perf_counter()
            a @ b
            sync()
            best[dt] = min(best[dt], time.perf_counter() - t0)
    flops = 2.0 * n**3
    return {
        "fp32": flops / best[torch.float32] / 1e9,
        "bf16": flops / best[torch.bfloat16] / 1e9,
        "n": n,
        "reps": reps,
        "threads": torch.get_num_threads(),
        "precision_flags": precision_flags(),
    }


def flops_per_sample(model: str, batch: int, in_channels: int = 1, image_size: int = 28) -> float:
    """Forward+backward FLOPs per sample (matmuls and convolutions), counted on the meta device."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from accel_train.models import create_model

    with torch.device("meta"):
        net = create_model(model, 10, in_channels, image_size)
        x = torch.randn(batch, in_channels, image_size, image_size)
        y = torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(x), y).backward()
    return counter.get_total_flops() / batch


def time_train_help(runs: int = 3) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(TRAIN_SCRIPT), "--help"],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": times}
    return {"median_s": statistics.median(times), "runs_s": times}


def time_default_run(work: Path, runs: int = 2) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults (lenet on digits, 8 epochs), timed from process start.

    The breakdown comes from the run's summary.json: ``before_fit_s`` is the interpreter, imports and
    argument parsing (process wall minus ``wall_time_s``), ``setup_s`` the run's own set-up (data,
    model, Accelerator, run folder, and the imports ``fit`` does lazily), ``train_s`` the steps,
    evaluations and exports up to the last ``metrics.jsonl`` event, ``finish_s`` what follows it (plots,
    summary). The median run by wall time is reported.
    """
    rows = []
    for i in range(runs):
        out = work / f"default_run_{i}"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(TRAIN_SCRIPT), "--output-dir", str(out)],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": [r["process_wall_s"] for r in rows]}
        summary = _load_json(out / "summary.json") or {}
        fit_s, setup_s = summary.get("wall_time_s") or 0.0, summary.get("setup_s") or 0.0
        records = [r for events in read_metrics(out).values() for r in events]
        last_t = max((r.get("time_s", 0.0) for r in records), default=0.0)
        rows.append(
            {
                "process_wall_s": wall,
                "before_fit_s": wall - fit_s,
                "setup_s": setup_s,
                "train_s": last_t,
                "finish_s": max(fit_s - setup_s - last_t, 0.0),
                "eval_accuracy": summary.get("eval_accuracy"),
            }
        )
    median = sorted(rows, key=lambda r: r["process_wall_s"])[(len(rows) - 1) // 2]
    return {**median, "runs_s": [r["process_wall_s"] for r in rows], "command": "python scripts/train.py"}


def machine_info(threads: int, mode: str, with_cuda: bool, tf32: bool = True) -> dict[str, Any]:
    import accelerate
    import torch

    reps = {"smoke": 1, "quick": 4, "full": 10}[mode]
    n = 512 if mode == "smoke" else 2048
    peak = measure_gemm_peak(threads, n=n, reps=reps)  # CPU: the TF32 flags do not apply, left as they are
    info: dict[str, Any] = {
        "cores": available_cores(),
        "threads": threads,
        **cpu_description(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
        "peak_gflops_fp32": peak["fp32"],
        "peak_gflops_bf16": peak["bf16"],
        "gemm_bf16_over_fp32": peak["bf16"] / peak["fp32"],
        "gemm_size": n,
        "precision_flags": peak["precision_flags"],  # this process's defaults (the CPU runs leave them alone)
        "cuda": torch.cuda.get_device_name(0) if with_cuda else None,
        "cuda_tf32": tf32 if with_cuda else None,
    }
    if with_cuda:
        gpu = measure_gemm_peak(threads, n=4096, reps=reps, device="cuda", tf32=tf32)
        info["peak_gflops_fp32_cuda"], info["peak_gflops_bf16_cuda"] = gpu["fp32"], gpu["bf16"]
        info["cuda_precision_flags"] = gpu["precision_flags"]  # == what both loops are given
        info["cuda_device_count"] = torch.cuda.device_count()
        info["cuda_pinned_device"] = first_visible_gpu()  # this process's cuda:0, where the GEMM peak ran
    return info


# --------------------------------------------------------------------------- the portable loop

_WRAPPER = '''\
"""Generated by benchmarks.bench: run scripts/train.py exactly as launched, then record peak memory."""
import json, os, resource, runpy, sys

TRAIN = {train!r}
sys.path.insert(0, {repo!r})


def _record():
    out = os.environ.get("ACCEL_BENCH_MEM_DIR")
    if not out:
        return
    rank = int(os.environ.get("RANK", "0") or 0)
    info = {{"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        info["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if torch is not None:  # as they were at the end of the run (did anything change them?)
        info["precision_flags"] = {{
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }}
    with open(os.path.join(out, "rank%d.json" % rank), "w") as fh:
        json.dump(info, fh)


import accel_train.runtime as _runtime  # multi-process runs leave through finish_process (os._exit)
import torch as _torch

if os.environ.get("ACCEL_BENCH_TF32") in ("0", "1"):  # the benchmark's TF32 choice, as for its plain loop
    _torch.backends.cuda.matmul.allow_tf32 = _torch.backends.cudnn.allow_tf32 = os.environ["ACCEL_BENCH_TF32"] == "1"

_finish = _runtime.finish_process


def _finish_and_record(exit_code=0):
    _record()
    _finish(exit_code)


_runtime.finish_process = _finish_and_record
sys.argv[0] = TRAIN
try:
    runpy.run_path(TRAIN, run_name="__main__")
finally:
    _record()
'''


def write_wrapper(directory: Path, train: Path = TRAIN_SCRIPT) -> Path:
    path = directory / "train_with_memory.py"
    path.write_text(_WRAPPER.format(train=str(train), repo=str(REPO)))
    return path


def synthetic_size(batch: int, total_steps: int) -> int:
    """One spare batch: the measured steps never reach an epoch end (no epoch-end evaluation)."""
    return batch * (total_steps + 1)


def portable_command(
    setup: Setup,
    model: str,
    batch: int,
    steps: int,
    run_dir: Path,
    wrapper: Path,
    mode: str,
    workload: Workload = WORKLOADS["mnist"],
) -> list[str]:
    total = WARMUP_STEPS + steps
    args = [
        "--dataset",
        "synthetic",
        *workload.train_args(),
        "--model",
        model,
        "--max-steps",
        str(total),
        "--global-batch-size",
        str(batch),
        "--synthetic-size",
        str(synthetic_size(batch, total)),
        "--synthetic-test-size",
        "64",
        "--report-to",
        "none",
        "--no-plots",
        "--no-progress",
        "--no-checkpoint-epochs",
        "--output-dir",
        str(run_dir),
        "--overwrite",
    ]
    if setup.channels_last:
        args.append("--channels-last")
    if setup.processes > 1:
        return [*accelerate_launch("multi_cpu.yaml"), str(wrapper), *args]
    if setup.bf16 and mode == "full" and setup.device == "cpu":
        return [*accelerate_launch("cpu_bf16.yaml"), str(wrapper), *args]
    if setup.bf16:
        args += ["--mixed-precision", "bf16"]
    return [sys.executable, str(wrapper), *args]


def _display_command(cmd: list[str]) -> str:
    """The command as a user would type it (the memory wrapper shown as scripts/train.py)."""
    shown = []
    for part in cmd:
        if part == sys.executable:
            shown.append("python")
        elif part.endswith("train_with_memory.py"):
            shown.append("scripts/train.py")
        elif part.startswith(str(CONFIG_DIR)):
            shown.append(str(Path(part).relative_to(REPO)))
        elif "/" in part and ("portable_" in part or part.startswith(tempfile.gettempdir())):
            shown.append("OUT")
        else:
            shown.append(part)
    text = " ".join(shown)
    return text.replace("python -m accelerate.commands.accelerate_cli launch", "accelerate launch")


def portable_env(
    setup: Setup, opts: BenchOptions, mem_dir: Path, parent_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a portable run: GPUs pinned (see ``visible_devices``), the TF32 choice for the wrapper."""
    env = child_env({"ACCEL_BENCH_MEM_DIR": str(mem_dir)})
    visible = visible_devices(setup, parent_env)
    if visible is not None and setup.processes == 1:  # multi_cpu.yaml hides the GPUs itself
        env["CUDA_VISIBLE_DEVICES"] = visible
    tf32 = opts.cuda_tf32(setup)
    if tf32 is not None:
        env["ACCEL_BENCH_TF32"] = "1" if tf32 else "0"
    return env


def portable_summary_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """What a portable run reports from its summary.json (keys a trainer version lacks read as None)."""
    return {
        "samples_per_s": summary.get("train_samples_per_s"),
        "data_wait_fraction": summary.get("data_wait_fraction"),
        "threads_per_process": summary.get("threads_per_process"),
        "global_batch": summary.get("global_batch"),
        "peak_memory_mb": summary.get("peak_memory_mb"),  # torch.cuda.max_memory_allocated; None on CPU
        "data_parallel": summary.get("data_parallel"),
        "device": summary.get("device"),
    }


def setup_mismatch(setup: Setup, summary: dict[str, Any], ranks: Sequence[dict[str, Any]], tf32: bool | None) -> str:
    """Why a portable run is not the intended setup ('' when it is)."""
    problems = []
    expected = "bf16" if setup.bf16 else "no"
    if summary.get("mixed_precision") != expected or summary.get("world_size") != setup.processes:
        problems.append(f"mixed_precision {summary.get('mixed_precision')}, world_size {summary.get('world_size')}")
    if summary.get("data_parallel"):
        problems.append("it ran nn.DataParallel over several GPUs (CUDA_VISIBLE_DEVICES did not pin one)")
    if tf32 is not None:
        for r in ranks:
            flags = r.get("precision_flags")
            if flags and (flags["matmul_allow_tf32"], flags["cudnn_allow_tf32"]) != (tf32, tf32):
                problems.append(f"TF32 flags at the end of the run {flags}, set to {tf32} at its start")
                break
    return "the run did not use the intended setup: " + "; ".join(problems) if problems else ""


def run_portable(setup: Setup, model: str, opts: BenchOptions, work: Path, wrapper: Path, tag: str) -> dict[str, Any]:
    workload = opts.workload_for(setup)
    plan = workload.plans[model]
    run_dir = work / f"portable_{model}_{setup.name}_{tag}"
    mem_dir = work / f"mem_{model}_{setup.name}_{tag}"
    mem_dir.mkdir(parents=True, exist_ok=True)
    cmd = portable_command(setup, model, plan.batch, opts.steps(model, workload), run_dir, wrapper, opts.mode, workload)
    if opts.cuda_tf32(setup) is False:  # train.py sets TF32 from --tf32 itself (runtime.configure_backends)
        cmd.append("--no-tf32")
    env = portable_env(setup, opts, mem_dir)
    shown = _display_command(cmd)
    if setup.device == "cuda" and "CUDA_VISIBLE_DEVICES" in env:
        shown = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} {shown}"
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800 if opts.mode == "full" else 400
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "command": shown}
    out: dict[str, Any] = {
        "command": shown,
        "wall_s": time.perf_counter() - t0,
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES") if setup.device == "cuda" else None,
    }
    summary_path = run_dir / "summary.json"
    if proc.returncode != 0 or not summary_path.is_file():
        out["error"] = f"exit {proc.returncode}: {_tail(proc.stderr)}"
        return out
    summary = _load_json(summary_path)
    ranks = [_load_json(p) for p in sorted(mem_dir.glob("rank*.json"))]
    mismatch = setup_mismatch(setup, summary, ranks, opts.cuda_tf32(setup))
    if mismatch:
        out["error"] = mismatch
    windows = []  # train events every log_every (10) steps; the first window holds the warm-up steps
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "train" and record.get("step", 0) > WINDOW_STEPS and "samples_per_s" in record:
                windows.append(record["samples_per_s"])
    out.update(portable_summary_fields(summary))
    out.update(
        {
            "window_samples_per_s": windows,
            "peak_rss_mb": max((r["peak_rss_mb"] for r in ranks), default=None),
            "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in ranks],
            "peak_cuda_mb": max((r["peak_cuda_mb"] for r in ranks if "peak_cuda_mb" in r), default=None),
            "precision_flags": ranks[0].get("precision_flags") if ranks else None,
        }
    )
    if not opts.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(mem_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- the plain loop (runs in children)


class PlainTrainer:
    """The hand-written loop: synthetic uint8 tensors in memory, normalised per batch, Adam, cross-entropy.

    ``batch`` is the global batch; under DDP each rank takes its contiguous share of
    every global batch (as Accelerate shards batches). ``train_step`` never waits for the
    device; ``log_point`` (every ``log_every`` steps, as the portable loop logs) is the one
    host sync. ``step`` times each phase with a device sync after it (the breakdown probes).
    """

    def __init__(
        self,
        model: str,
        batch: int,
        total_steps: int,
        *,
        bf16: bool = False,
        channels_last: bool = False,
        fused: bool | None = None,
        clip: float = DEFAULT_CLIP,
        device: str = "cpu",
        seed: int = SYNTHETIC_SEED,
        channels: int = 1,
        image_size: int = 28,
    ):
        import torch
        import torch.distributed as dist

        from accel_train.data.synthetic import make_synthetic
        from accel_train.models import create_model

        self.torch = torch
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.device = torch.device(device)
        self.batch, self.micro = batch, batch // self.world
        self.bf16, self.clip = bf16, clip
        n = synthetic_size(batch, total_steps)
        self.images, self.labels = make_synthetic(n, 10, channels, image_size, seed=seed)  # the portable's data
        self.order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(seed)
        net = create_model(model, 10, channels, image_size).to(self.device)
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(net)
        self.model = net
        kwargs = {} if fused is None else {"fused": fused}
        self.optimizer = torch.optim.Adam(net.parameters(), lr=DEFAULT_LR, **kwargs)
        self.scale = 1.0 / (255.0 * SYNTHETIC_STD)
        self.shift = -SYNTHETIC_MEAN / SYNTHETIC_STD
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._loss_sum = None  # the open log window's loss, on the device
        self.host_syncs = 0  # log points: .item() reads of the running loss

    def batch_at(self, step: int):
        start = step * self.batch + self.rank * self.micro
        idx = self.order[start : start + self.micro]
        images, labels = self.images.index_select(0, idx), self.labels.index_select(0, idx)
        if self.device.type == "cuda":  # as accel_train's loader (pin_memory on CUDA): the copy stays asynchronous
            images, labels = images.pin_memory(), labels.pin_memory()
        return images, labels

    def forward_backward(self, images, labels, sync: bool = True):
        import torch.nn.functional as F

        torch = self.torch
        images, labels = images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
        no_sync = self.world > 1 and not sync
        with self.model.no_sync() if no_sync else nullcontext():
            x = images.to(torch.float32).mul_(self.scale).add_(self.shift).contiguous(memory_format=self.memory_format)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float(), labels)
            loss.backward()
        return loss

    def optimizer_step(self) -> None:
        if self.clip > 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One step without waiting for the device: host seconds (data, forward+backward, optimizer).

        On CPU the host seconds are the phase times; on CUDA they are launch times (see ``step``).
        """
        t0 = time.perf_counter()
        images, labels = self.batch_at(step)
        t1 = time.perf_counter()
        loss = self.forward_backward(images, labels).detach()
        t2 = time.perf_counter()
        self.optimizer_step()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    def log_point(self) -> float | None:
        """What a hand-written loop does every ``log_every`` steps: read its running loss (waits for the device)."""
        if self._loss_sum is None:
            return None
        self.host_syncs += 1
        value = self._loss_sum.item()
        self._loss_sum = None
        return value

    def step(self, step: int, sync: bool = True) -> tuple[float, float, float]:
        """One step timed per phase, with a device sync after each: (data, forward+backward, optimizer) seconds."""
        t0 = time.perf_counter()
        images, labels = self.batch_at(step)
        t1 = time.perf_counter()
        self.forward_backward(images, labels, sync)
        self._sync()
        t2 = time.perf_counter()
        self.optimizer_step()
        self._sync()
        return t1 - t0, t2 - t1, time.perf_counter() - t2


def plain_throughput(
    trainer: PlainTrainer, steps: int, log_every: int = WINDOW_STEPS, warmup: int = WARMUP_STEPS
) -> dict[str, Any]:
    """``warmup`` steps, then ``steps`` measured steps that sync the host only at log points.

    Log points fall where the portable loop logs (global step % ``log_every`` == 0, warm-up
    steps counted); the clock starts after the warm-up's work has drained and stops after
    the last step's. ``window_samples_per_s``: the full windows between two log points (the
    portable reports the same windows). ``phase_s``: host seconds per phase, summed.
    """
    for i in range(warmup):
        trainer.train_step(i)
    trainer.log_point()
    data = fb = opt = 0.0
    windows: list[float] = []
    t_start = time.perf_counter()
    last_log: tuple[int, float] | None = None  # (global step, time) of the last log point in the measurement
    for i in range(warmup, warmup + steps):
        d, f, o = trainer.train_step(i)
        data, fb, opt = data + d, fb + f, opt + o
        global_step = i + 1
        if log_every and global_step % log_every == 0:
            trainer.log_point()
            now = time.perf_counter()
            if last_log is not None:
                windows.append(trainer.batch * (global_step - last_log[0]) / (now - last_log[1]))
            last_log = (global_step, now)
    trainer.log_point()  # the tail after the last log point (nothing when the last step was one)
    seconds = time.perf_counter() - t_start
    return {
        "seconds": seconds,
        "samples_per_s": trainer.batch * steps / seconds,
        "window_samples_per_s": windows,
        "phase_s": {"data_wait": data, "forward_backward": fb, "optimizer": opt},
        "log_every": log_every,
    }


def _plain_measure(run: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    steps, probe = run["steps"], run.get("sync_probe_steps", 0)
    device = run.get("device", "cpu")
    cuda = device == "cuda"
    phase_steps = min(steps, WINDOW_STEPS) if cuda else 0  # CUDA: the breakdown needs synced steps of its own
    total = WARMUP_STEPS + steps + 2 * probe + phase_steps
    if cuda:
        if run.get("tf32") is not None:
            set_tf32(run["tf32"])
        gc.collect()  # this server measured other models before: their peak must not count
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = PlainTrainer(
        run["model"],
        run["batch"],
        total,
        bf16=run.get("bf16", False),
        channels_last=run.get("channels_last", False),
        device=device,
        channels=run.get("channels", 1),
        image_size=run.get("image_size", 28),
    )
    timing = plain_throughput(trainer, steps, log_every=run.get("log_every", WINDOW_STEPS))
    next_step = WARMUP_STEPS + steps
    phase = timing["phase_s"]
    data, fb, opt = phase["data_wait"], phase["forward_backward"], phase["optimizer"]
    sync_s = 0.0
    if trainer.world > 1 and probe:
        # gradient synchronisation: backward with DDP's all-reduce vs backward under no_sync, alternated
        synced, local = [], []
        for j in range(2 * probe):
            _, f, _ = trainer.step(next_step + j, sync=j % 2 == 0)
            (synced if j % 2 == 0 else local).append(f)
        next_step += 2 * probe
        sync_s = max(0.0, statistics.median(synced) - statistics.median(local))
        sync_s = min(sync_s, fb / steps)  # a noisy probe must not claim more than the whole backward
    breakdown_source = "host time of the measured steps (CPU: the host waits for every op)"
    if phase_steps:
        probes = [trainer.step(next_step + j) for j in range(phase_steps)]
        data, fb, opt = (sum(p[k] for p in probes) * steps / phase_steps for k in range(3))
        breakdown_source = f"{phase_steps} extra steps with a device sync after each phase"
    scalar_allreduce_ms = None
    if trainer.world > 1:  # what one extra scalar collective per step costs (e.g. a stop-flag all-reduce)
        import torch.distributed as dist

        flag = trainer.torch.zeros(1)
        dist.all_reduce(flag)
        t0 = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        scalar_allreduce_ms = (time.perf_counter() - t0) / 20 * 1000
    total_s = timing["seconds"]
    per_step = {
        k: 1000.0 * v / steps
        for k, v in (
            ("data_wait", data),
            ("forward_backward", fb - sync_s * steps),
            ("sync", sync_s * steps),
            ("optimizer", opt),
            ("total", total_s),
        )
    }
    return {
        "model": run["model"],
        "samples_per_s": timing["samples_per_s"],
        "window_samples_per_s": timing["window_samples_per_s"],
        "data_wait_fraction": min(1.0, phase["data_wait"] / total_s),
        "step_breakdown_ms": per_step,
        "breakdown_source": breakdown_source,
        "scalar_allreduce_ms": scalar_allreduce_ms,
        "threads": trainer.torch.get_num_threads(),
        "world_size": trainer.world,
        "log_every": timing["log_every"],
        "host_syncs": trainer.host_syncs,  # log points, not steps
        "precision_flags": precision_flags(),
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") if cuda else None,
    }


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _child_server(spec: dict[str, Any]) -> None:
    """A plain-loop process (or DDP rank) that stays up and measures on request.

    The parent writes ``cmd_<k>.json``; every rank runs it and writes
    ``res_<k>.rank<r>.json``. One start-up per setup, yet each plain measurement
    is taken right next to the portable run it is compared with.
    """
    import resource

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    torch.set_num_threads(spec.get("threads") or max(1, available_cores() // local_world))  # == runtime's rule
    if world > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0") or 0)
    directory, parent = Path(spec["dir"]), int(spec["parent_pid"])
    k = 0
    while True:
        cmd_path = directory / f"cmd_{k}.json"
        while not cmd_path.exists():
            if not pid_alive(parent):
                os._exit(1)
            time.sleep(0.05)
        command = _load_json(cmd_path)
        if command.get("exit"):
            break
        try:
            result = _study(command) if command.get("kind") == "study" else _plain_measure(command)
        except Exception as exc:  # report it, keep serving
            result = {"model": command.get("model"), "error": f"{type(exc).__name__}: {exc}"}
        result["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        _write_atomic(directory / f"res_{k}.rank{rank}.json", result)
        k += 1
    if world > 1:
        from accel_train.runtime import finish_process

        dist.barrier()
        dist.destroy_process_group()
        finish_process(0)


class PlainServer:
    """The parent's handle on one plain-loop process (1 process, or ``processes`` torchrun ranks)."""

    def __init__(self, setup: Setup, work: Path, tag: str, threads: int | None = None):
        self.setup = setup
        self.dir = work / f"plain_{setup.name}_{tag}"
        self.dir.mkdir(parents=True, exist_ok=True)
        spec_path = self.dir / "spec.json"
        _write_atomic(spec_path, {"dir": str(self.dir), "parent_pid": os.getpid(), "threads": threads})
        child = ["-m", "benchmarks.bench", "--child", "server", str(spec_path)]
        if setup.processes > 1:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(setup.processes),
                *child,
            ]
        else:
            cmd = [sys.executable, *child]
        env = child_env()
        visible = visible_devices(setup)  # CPU: none; one CUDA process: one GPU, the portable run's
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        self.cuda_visible_devices = visible
        self.log_path = self.dir / "output.txt"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.k = 0

    def _output_tail(self) -> str:
        try:
            return _tail(self.log_path.read_text())
        except OSError:
            return ""

    def request(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        k = self.k
        self.k += 1
        if self.proc.poll() is not None:
            return {
                "model": command.get("model"),
                "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
            }
        _write_atomic(self.dir / f"cmd_{k}.json", command)
        wanted = [self.dir / f"res_{k}.rank{r}.json" for r in range(self.setup.processes)]
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in wanted):
            if self.proc.poll() is not None:
                return {
                    "model": command.get("model"),
                    "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
                }
            if time.monotonic() > deadline:
                self.proc.kill()
                return {"model": command.get("model"), "error": f"timed out after {timeout:.0f}s"}
            time.sleep(0.02)
        return _load_json(wanted[0])  # rank 0: global samples/s; its phase times

    def close(self) -> None:
        if self.proc.poll() is None:
            _write_atomic(self.dir / f"cmd_{self.k}.json", {"exit": True})
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ServerPool:
    """One plain-loop server per (processes, device): fp32, bf16 and channels_last are per-request flags."""

    def __init__(self, work: Path):
        self.work = work
        self.servers: dict[tuple[int, str], PlainServer] = {}

    def get(self, setup: Setup) -> PlainServer:
        key = (setup.processes, setup.device)
        if key not in self.servers:
            self.servers[key] = PlainServer(setup, self.work, f"{setup.processes}p_{setup.device}")
        return self.servers[key]

    def close(self, processes: int | None = None) -> None:
        for key in [k for k in self.servers if processes is None or k[0] == processes]:
            self.servers.pop(key).close()


def plain_command(setup: Setup, model: str, opts: BenchOptions) -> dict[str, Any]:
    workload = opts.workload_for(setup)
    return {
        "model": model,
        "batch": workload.plans[model].batch,
        "steps": opts.steps(model, workload),
        "channels": workload.channels,
        "image_size": workload.image_size,
        "bf16": setup.bf16,
        "channels_last": setup.channels_last,
        "device": setup.device,
        "tf32": opts.cuda_tf32(setup),
        "log_every": WINDOW_STEPS,
        "sync_probe_steps": (6 if opts.mode == "full" else 1) if setup.processes > 1 else 0,
    }


# --------------------------------------------------------------------------- the bf16 study

STUDY_VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": "fp32", "bf16": False, "channels_last": False},
    {"name": "bf16", "bf16": True, "channels_last": False},
    {"name": "fp32+channels_last", "bf16": False, "channels_last": True},
    {"name": "bf16+channels_last", "bf16": True, "channels_last": True},
    {"name": "fp32+fused_adam", "bf16": False, "channels_last": False, "fused": True},
    {"name": "bf16+channels_last+fused_adam", "bf16": True, "channels_last": True, "fused": True},
)
PROFILED_VARIANTS = ("fp32", "bf16", "bf16+channels_last")


def _op_category(name: str) -> str:
    if "conv" in name:
        return "convolution"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "matmul"
    if name in ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"):
        return "cast/copy"
    if "batch_norm" in name:
        return "batch_norm"
    return "other"


def _study(spec: dict[str, Any]) -> dict[str, Any]:
    """All variants of one model stepped round-robin in this process (same noise for all); fwd+bwd profile."""
    from torch.profiler import ProfilerActivity, profile

    model, batch, rounds = spec["model"], spec["batch"], spec["rounds"]
    per_round, warm = 1, 2  # variants alternate every step: machine noise hits all of them alike
    total = warm + rounds * per_round + 1
    shape = {"channels": spec.get("channels", 1), "image_size": spec.get("image_size", 28)}
    trainers = {
        v["name"]: PlainTrainer(
            model, batch, total, bf16=v["bf16"], channels_last=v["channels_last"], fused=v.get("fused"), **shape
        )
        for v in spec["variants"]
    }
    times: dict[str, dict[str, list[float]]] = {k: {"step": [], "fb": [], "opt": []} for k in trainers}
    for trainer in trainers.values():
        for i in range(warm):
            trainer.step(i)
    step = warm
    for _ in range(rounds):
        for name, trainer in trainers.items():
            for i in range(per_round):
                d, f, o = trainer.step(step + i)
                times[name]["step"].append(d + f + o)
                times[name]["fb"].append(f)
                times[name]["opt"].append(o)
        step += per_round
    results = []
    for v in spec["variants"]:
        t = times[v["name"]]
        results.append(
            {
                **v,
                "step_ms": 1000 * statistics.median(t["step"]),
                "forward_backward_ms": 1000 * statistics.median(t["fb"]),
                "optimizer_ms": 1000 * statistics.median(t["opt"]),
            }
        )
    profiles: dict[str, Any] = {}
    for name in PROFILED_VARIANTS if spec.get("profile") else ():
        if name not in trainers:
            continue
        trainer = trainers[name]
        images, labels = trainer.batch_at(step)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.forward_backward(images, labels)
        trainer.optimizer_step()
        events = [(e.key, e.self_cpu_time_total / 1000.0) for e in prof.key_averages()]
        categories: dict[str, float] = {}
        for key, ms in events:
            categories[_op_category(key)] = categories.get(_op_category(key), 0.0) + ms
        top = sorted(events, key=lambda e: -e[1])[:6]
        profiles[name] = {
            "forward_backward_ms": sum(ms for _, ms in events),
            "categories_ms": {k: round(v, 2) for k, v in sorted(categories.items())},
            "top_ops_ms": [[k, round(ms, 2)] for k, ms in top],
        }
    return {
        "model": model,
        "batch": batch,
        "rounds": rounds,
        "steps_per_round": per_round,
        "variants": results,
        "profiles": profiles,
    }


def _study_variants(model: str, mode: str) -> list[dict[str, Any]]:
    if mode == "full":
        return list(STUDY_VARIANTS)
    chosen = [v for v in STUDY_VARIANTS if not v.get("fused")]
    if model == "mnist_cnn":  # its step is dominated by Adam on a 25.7M-parameter dense layer
        chosen.append(next(v for v in STUDY_VARIANTS if v["name"] == "fp32+fused_adam"))
    return chosen


def run_study(models: Sequence[str], opts: BenchOptions, pool: ServerPool) -> list[dict[str, Any]]:
    rounds = {"smoke": 1, "quick": 2, "full": 8}[opts.mode]
    server = pool.get(SETUPS[0])  # 1 process, all cores
    workload = opts.workload_for(SETUPS[0])
    out = []
    for model in models:
        opts.log(f"bench: bf16 study ({model}: fp32/bf16 x NCHW/channels_last, round-robin in one process)")
        variants = _study_variants(model, opts.mode)
        result = server.request(
            {
                "kind": "study",
                "model": model,
                "batch": workload.plans[model].batch,
                "channels": workload.channels,
                "image_size": workload.image_size,
                "rounds": rounds,
                "variants": variants,
                "profile": True,
            },
            timeout=1800,
        )
        result.setdefault("model", model)
        base = next((v["step_ms"] for v in result.get("variants", []) if v["name"] == "fp32"), None)
        for v in result.get("variants", []):
            v["speedup_vs_fp32"] = _ratio(base, v["step_ms"])
        out.append(result)
    return out


# --------------------------------------------------------------------------- time to accuracy


def mnist_available(data_dir: str | None) -> bool:
    if not data_dir:
        return False
    from accel_train.data.vision import MNIST_FILES

    raw = Path(data_dir).expanduser() / "MNIST" / "raw"
    names = [n for pair in MNIST_FILES.values() for n in pair]
    return all((raw / n).is_file() or (raw / f"{n}.gz").is_file() for n in names)


def time_to_accuracy_portable(dataset: str, data_dir: str | None, work: Path, cap_s: float) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults; seconds from launch to the first eval >= target.

    metrics.jsonl is polled while the run trains; each eval line is timestamped when it
    appears (its ``time_s`` counts from the run's logger start, after imports and data).
    The run is stopped (SIGTERM: it checkpoints and exits) once the target is reached.
    """
    run_dir = work / f"t2a_portable_{dataset}"
    eval_every = 5 if dataset == "digits" else 100
    args = ["--output-dir", str(run_dir), "--overwrite", "--eval-every", str(eval_every), "--no-plots"]
    if dataset != "digits":
        args += ["--dataset", dataset, "--data-dir", str(data_dir)]
    cmd = [sys.executable, str(TRAIN_SCRIPT), *args]
    metrics = run_dir / "metrics.jsonl"
    evals: list[dict[str, Any]] = []
    reached: dict[str, Any] | None = None
    t_launch = time.perf_counter()
    err_path = work / f"t2a_portable_{dataset}.err"
    with open(err_path, "w") as err:  # a file, not a pipe: a chatty child can never block on it
        proc = subprocess.Popen(cmd, cwd=REPO, env=one_gpu_env(), stdout=subprocess.DEVNULL, stderr=err)
    offset = 0
    stopped_by = None
    while True:
        done = proc.poll() is not None
        now = time.perf_counter() - t_launch
        if metrics.is_file():
            with open(metrics) as fh:
                fh.seek(offset)
                chunk = fh.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                if record.get("event") != "eval":
                    continue
                entry = {
                    "step": record["step"],
                    "epoch": record["epoch"],
                    "accuracy": record["eval_accuracy"],
                    "time_s": now,
                    "logger_time_s": record.get("time_s"),
                }
                evals.append(entry)
                if reached is None and record["eval_accuracy"] >= TARGET_ACCURACY:
                    reached = entry
        if done:
            break
        if reached is not None or now > cap_s:
            stopped_by = "target reached" if reached is not None else f"cap of {cap_s:.0f}s"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            continue
        time.sleep(0.05)
    stderr = err_path.read_text(errors="replace")
    out: dict[str, Any] = {
        "recipe": "scripts/train.py defaults (lenet, batch 32, Adam 2e-3 cosine, in-memory uint8 batches)",
        "command": " ".join(["python", "scripts/train.py", *[("OUT" if a == str(run_dir) else a) for a in args]]),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "train_time_to_target_s": reached["logger_time_s"] if reached else None,
        "step": reached["step"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "evals": len(evals),
        "stopped": stopped_by,
        "wall_s": time.perf_counter() - t_launch,
    }
    if proc.returncode not in (0, None) and stopped_by is None:
        out["error"] = f"exit {proc.returncode}: {_tail(stderr)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def time_to_accuracy_seed000(
    dataset: str, data_dir: str | None, work: Path, cap_s: float, max_epochs: int
) -> dict[str, Any]:
    out_path = work / f"t2a_seed000_{dataset}.json"
    spec_path = work / f"t2a_seed000_{dataset}_spec.json"
    t_launch = time.time()
    spec = {
        "dataset": dataset,
        "data_dir": data_dir,
        "t_launch": t_launch,
        "cap_s": cap_s,
        "max_epochs": max_epochs,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench", "--child", "seed000", str(spec_path)],
            cwd=REPO,
            env=one_gpu_env(),
            capture_output=True,
            text=True,
            timeout=cap_s + 300,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "reached": False}
    if proc.returncode != 0 or not out_path.is_file():
        return {"error": f"exit {proc.returncode}: {_tail(proc.stderr)}", "reached": False}
    result = _load_json(out_path)
    result["wall_s"] = time.time() - t_launch
    return result


def _child_seed000(spec: dict[str, Any]) -> None:
    """The seed-000 recipe: torchvision-style per-sample PIL dataset, ToTensor, DataLoader workers, .to(device)."""
    t_launch, cap_s = spec["t_launch"], spec["cap_s"]
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms

    from accel_train.data.base import DataConfig
    from accel_train.models import create_model

    if spec["dataset"] == "digits":
        from accel_train.data.digits import build_digits

        splits = build_digits(DataConfig())  # load_digits_dataset(), resized to 28x28 like the package
    else:
        from accel_train.data.vision import build_mnist

        splits = build_mnist(DataConfig(dataset="mnist", data_dir=spec["data_dir"]))

    class PILDataset(Dataset):
        """Like torchvision.datasets.MNIST: uint8 storage, one PIL image + transform per sample."""

        def __init__(self, split, transform):
            self.data = split.images[:, 0].numpy()
            self.targets = split.labels.tolist()
            self.transform = transform

        def __len__(self) -> int:
            return len(self.targets)

        def __getitem__(self, index: int):
            return self.transform(Image.fromarray(self.data[index])), self.targets[index]

    torch.manual_seed(0)
    to_tensor = transforms.ToTensor()
    train_dl = DataLoader(
        PILDataset(splits.train, to_tensor), batch_size=SEED000_BATCH, shuffle=True, num_workers=SEED000_WORKERS
    )
    test_dl = DataLoader(
        PILDataset(splits.test, to_tensor), batch_size=1000, shuffle=False, num_workers=SEED000_WORKERS
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = create_model("mnist_cnn", 10, 1, 28).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=SEED000_LR)
    epochs: list[dict[str, Any]] = []
    reached, capped = None, False
    for epoch in range(1, spec["max_epochs"] + 1):
        model.train()
        for images, labels in train_dl:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if time.time() - t_launch > cap_s:
                capped = True
                break
        if capped:
            break
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in test_dl:
                images, labels = images.to(device), labels.to(device)
                correct += (model(images).argmax(1) == labels).sum().item()
                total += labels.numel()
        accuracy = correct / total
        epochs.append({"epoch": epoch, "time_s": time.time() - t_launch, "accuracy": accuracy})
        if accuracy >= TARGET_ACCURACY:
            reached = epochs[-1]
            break
    result = {
        "recipe": (
            f"per-sample PIL + ToTensor, DataLoader(num_workers={SEED000_WORKERS}, shuffle=True), .to(device) "
            f"per step, mnist_cnn, Adam {SEED000_LR:g}, batch {SEED000_BATCH}, eval after each epoch"
        ),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in epochs), default=None),
        "epochs": epochs,
        "cap_s": cap_s,
        "max_epochs": spec["max_epochs"],
        "stopped": "target reached" if reached else (f"cap of {cap_s:.0f}s" if capped else "max epochs"),
        "elapsed_s": time.time() - t_launch,
    }
    Path(spec["out"]).write_text(json.dumps(result))


def time_to_accuracy(opts: BenchOptions, work: Path) -> dict[str, Any]:
    full = opts.mode == "full"
    caps = {"portable": 600.0 if full else 60.0, "seed000": 600.0 if full else 30.0, "epochs": 20 if full else 8}
    out: dict[str, Any] = {"target_accuracy": TARGET_ACCURACY, "caps": caps}
    datasets = ["digits"]
    if mnist_available(opts.data_dir):
        if full:
            datasets.append("mnist")
        else:
            out["mnist"] = {"skipped": "--quick: MNIST time to accuracy only in a full run"}
    else:
        out["mnist"] = {
            "skipped": (
                "no --data-dir given" if not opts.data_dir else f"no MNIST IDX files under {opts.data_dir}/MNIST/raw"
            )
        }
    for ds in datasets:
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: portable loop")
        portable = time_to_accuracy_portable(ds, opts.data_dir, work, caps["portable"])
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: seed-000 recipe")
        seed = time_to_accuracy_seed000(ds, opts.data_dir, work, caps["seed000"], caps["epochs"])
        entry: dict[str, Any] = {"portable": portable, "seed000": seed}
        if portable.get("reached"):
            if seed.get("reached"):
                entry["speedup"] = seed["time_to_target_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = False
            elif "elapsed_s" in seed:  # not reached in its budget: the speedup is at least this
                entry["speedup"] = seed["elapsed_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = True
        out[ds] = entry
    return out


# --------------------------------------------------------------------------- the run


def _cells(opts: BenchOptions, setups: Sequence[Setup]) -> list[tuple[Setup, str]]:
    subset = opts.mode == "quick" and not opts.models and not opts.setups
    cells = []
    for setup in setups:
        workload = opts.workload_for(setup)
        for model in [m for m in (opts.models or workload.models) if m in workload.plans]:
            if setup.study_only and model not in STUDY_MODELS:
                continue
            if subset and model not in QUICK_CELLS.get(setup.name, ()):
                continue
            cells.append((setup, model))
    return cells


def _select_setups(opts: BenchOptions, with_cuda: bool) -> list[Setup]:
    """Smoke: cpu_fp32. Quick: the three main setups (channels_last is covered by the bf16 study). Full: all."""
    available = list(SETUPS) + (list(CUDA_SETUPS) if with_cuda else [])
    if opts.smoke:
        return [SETUPS[0]]
    if opts.setups:
        names = {s.name for s in available}
        unknown = [n for n in opts.setups if n not in names]
        if unknown:
            from accel_train.errors import UserError

            raise UserError(f"unknown or unavailable setup(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        return [s for s in available if s.name in opts.setups]
    return [s for s in available if opts.mode == "full" or not s.study_only]


def measure_grid(
    opts: BenchOptions, setups: Sequence[Setup], work: Path, wrapper: Path, pool: ServerPool
) -> dict[tuple[str, str], dict[str, list[dict[str, Any]]]]:
    """Per cell: the plain loop right before the portable run (and right after it in full mode).

    The plain loop runs in long-lived servers (one start-up per process layout), so each
    plain measurement sits next to the portable run it is compared with.
    """
    cells = _cells(opts, setups)
    raw: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {
        (s.name, m): {"plain": [], "portable": []} for s, m in cells
    }
    timeout = 1800.0 if opts.mode == "full" else 400.0
    for rep in range(opts.n_repeats()):
        for setup in setups:
            models = [m for s, m in cells if s is setup]
            for model in models:
                server = pool.get(setup)
                prefix = f"bench: [{rep + 1}/{opts.n_repeats()}] {setup.name} {model}:"
                cell = raw[(setup.name, model)]
                opts.log(f"{prefix} plain loop")
                cell["plain"].append(server.request(plain_command(setup, model, opts), timeout))
                opts.log(f"{prefix} portable loop")
                cell["portable"].append(run_portable(setup, model, opts, work, wrapper, f"r{rep}"))
                if opts.mode == "full":
                    opts.log(f"{prefix} plain loop (after)")
                    cell["plain"].append(server.request(plain_command(setup, model, opts), timeout))
        pool.close(processes=2)  # the 2-rank server is not needed by the study; free its memory
    return raw


def aggregate(
    raw: dict[tuple[str, str], dict[str, list[dict[str, Any]]]],
    setups: Sequence[Setup],
    machine: dict[str, Any],
    opts: BenchOptions,
) -> list[dict[str, Any]]:
    by_name = {s.name: s for s in setups}
    results = []
    for (setup_name, model), runs in raw.items():
        setup = by_name[setup_name]
        workload = opts.workload_for(setup)
        plan = workload.plans[model]
        portable = [r for r in runs["portable"] if "error" not in r]
        plain = [r for r in runs["plain"] if "error" not in r]
        errors = [r["error"] for r in runs["portable"] + runs["plain"] if "error" in r]
        sps = _median([r["samples_per_s"] for r in portable])
        plain_sps = _median([r["samples_per_s"] for r in plain])
        best = max((w for r in portable for w in r.get("window_samples_per_s", [])), default=None)
        plain_best = max((w for r in plain for w in r.get("window_samples_per_s", [])), default=None)
        fps = flops_per_sample(model, plan.batch, workload.channels, workload.image_size)
        peak_key = "peak_gflops_bf16" if setup.bf16 else "peak_gflops_fp32"
        if setup.device == "cuda":
            peak_key += "_cuda"
        peak = machine.get(peak_key)
        breakdown = None
        if plain:
            keys = plain[0]["step_breakdown_ms"].keys()
            breakdown = {k: _median([r["step_breakdown_ms"][k] for r in plain]) for k in keys}
        entry: dict[str, Any] = {
            "model": model,
            "setup": setup_name,
            "processes": setup.processes,
            "precision": setup.precision,
            "channels_last": setup.channels_last,
            "device": setup.device,
            "workload": workload.name,
            "input_shape": [workload.channels, workload.image_size, workload.image_size],
            "global_batch": plan.batch,
            "steps_measured": opts.steps(model, workload),
            "warmup_steps": WARMUP_STEPS,
            "repeats": len(portable),
            "samples_per_s": sps,
            "samples_per_s_runs": [r["samples_per_s"] for r in portable],
            "plain_samples_per_s": plain_sps,
            "plain_samples_per_s_runs": [r["samples_per_s"] for r in plain],
            "ratio_vs_plain": _ratio(sps, plain_sps),
            "best_window_samples_per_s": best,
            "plain_best_window_samples_per_s": plain_best,
            "ratio_vs_plain_best_window": _ratio(best, plain_best),
            "data_wait_fraction": _median([r["data_wait_fraction"] for r in portable]),
            "plain_data_wait_fraction": _median([r["data_wait_fraction"] for r in plain]),
            "step_breakdown_ms": breakdown,
            "scalar_allreduce_ms": _median([r.get("scalar_allreduce_ms") for r in plain]),
            "gflop_per_sample": fps / 1e9,
            "achieved_gflops": sps * fps / 1e9 if sps else None,
            "mfu": sps * fps / 1e9 / peak if sps and peak else None,
            "plain_mfu": plain_sps * fps / 1e9 / peak if plain_sps and peak else None,
            "mfu_peak": peak_key,
            "peak_rss_mb": max((r["peak_rss_mb"] for r in portable if r.get("peak_rss_mb")), default=None),
            "peak_rss_mb_per_rank": portable[0]["peak_rss_mb_per_rank"] if portable else None,
            # peak CUDA memory allocated (portable: its summary.json; plain: max_memory_allocated); None on CPU
            "peak_memory_mb": max((r["peak_memory_mb"] for r in portable if r.get("peak_memory_mb")), default=None),
            "plain_peak_memory_mb": max((r["peak_memory_mb"] for r in plain if r.get("peak_memory_mb")), default=None),
            "cuda_visible_devices": next(
                (r["cuda_visible_devices"] for r in portable if r.get("cuda_visible_devices") is not None), None
            ),
            "precision_flags": {
                "portable": portable[0].get("precision_flags") if portable else None,
                "plain": plain[0].get("precision_flags") if plain else None,
            },
            "plain_log_every": plain[0].get("log_every") if plain else None,
            "plain_breakdown_source": plain[0].get("breakdown_source") if plain else None,
            "threads_per_process": portable[0]["threads_per_process"] if portable else None,
            "loadavg_1min": max((max(r["loadavg_1min"]) for r in portable if r.get("loadavg_1min")), default=None),
            "command": (runs["portable"][0].get("command") if runs["portable"] else None),
        }
        if any(r.get("peak_cuda_mb") for r in portable):
            entry["peak_cuda_mb"] = max(r["peak_cuda_mb"] for r in portable if r.get("peak_cuda_mb"))
        if errors:
            entry["errors"] = errors
        results.append(entry)
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if base and r["setup"] != "cpu_fp32" and base["workload"] == r["workload"]:
            r["speedup_vs_cpu_fp32"] = _ratio(r["samples_per_s"], base["samples_per_s"])
            r["plain_speedup_vs_cpu_fp32"] = _ratio(r["plain_samples_per_s"], base["plain_samples_per_s"])
    return results


def _goal(
    goal: str, value: float | None, threshold: float, higher_is_better: bool = True, best_window: float | None = None
) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    return {"goal": goal, "value": value, "value_best_window": best_window, "threshold": threshold, "met": met}


def evaluate_goals(
    results: list[dict[str, Any]],
    t2a: dict[str, Any] | None,
    help_timing: dict[str, Any],
    default_run: dict[str, Any] | None = None,
    cpu_kind: str = "unknown",
) -> list[dict[str, Any]]:
    """Each goal of the issue with the measured value; reported, never asserted.

    ``value`` uses the steady-state means (summary.json); ``value_best_window`` the best
    10-step windows of both sides (less sensitive to other processes on the CPU), where measured.
    """
    goals = []
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        if r.get("ratio_vs_plain") is not None and (r["setup"] in ("cpu_fp32", "cuda_fp32") or r["model"] == "lenet"):
            where = r["setup"] if r["setup"] != "cuda_fp32" else f"1 GPU, {r.get('workload', 'mnist')}"
            goals.append(
                _goal(
                    f"portable >= {GOAL_RATIO_VS_PLAIN}x plain samples/s ({r['model']}, {where})",
                    r["ratio_vs_plain"],
                    GOAL_RATIO_VS_PLAIN,
                    best_window=r.get("ratio_vs_plain_best_window"),
                )
            )
    waits = [r for r in results if r["data_wait_fraction"] is not None]
    if waits:
        worst = max(waits, key=lambda r: r["data_wait_fraction"])
        goals.append(
            _goal(
                f"data wait <= {GOAL_DATA_WAIT:.0%} of step time (worst: {worst['model']}, {worst['setup']})",
                worst["data_wait_fraction"],
                GOAL_DATA_WAIT,
                higher_is_better=False,
            )
        )
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if r["setup"] == "gloo_2proc" and base:
            goals.append(
                _goal(
                    f"2-process gloo >= {GOAL_DDP_SCALING}x 1-process samples/s ({r['model']}, same global batch)",
                    r.get("speedup_vs_cpu_fp32"),
                    GOAL_DDP_SCALING,
                    best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
                )
            )
    goals += _bf16_goals(index, cpu_kind)
    goals += _default_run_goals(default_run)
    digits = (t2a or {}).get("digits") or {}
    if digits.get("speedup") is not None:
        lower = bool(digits.get("speedup_is_lower_bound"))
        g = _goal(
            f"time to {TARGET_ACCURACY:.0%} on digits >= {GOAL_T2A_SPEEDUP:g}x faster than the seed-000 recipe"
            + (" (lower bound: seed-000 did not reach it in its budget)" if lower else ""),
            digits["speedup"],
            GOAL_T2A_SPEEDUP,
        )
        if lower and not g["met"]:
            g["met"] = None  # a lower bound below the goal decides nothing
        goals.append(g)
    if "median_s" in help_timing:
        goals.append(
            _goal(
                f"python scripts/train.py --help < {GOAL_HELP_S:g} s",
                help_timing["median_s"],
                GOAL_HELP_S,
                higher_is_better=False,
            )
        )
    return goals


def _bf16_goals(index: dict[tuple[str, str], dict[str, Any]], cpu_kind: str) -> list[dict[str, Any]]:
    """bf16 resnet18 >= 2x fp32 and bf16 MFU >= 25%: goals for AMX CPUs; elsewhere measured, marked n/a."""
    goals = []
    for setup in ("cpu_bf16", "cpu_bf16_cl"):
        r, base = index.get((setup, "resnet18")), index.get(("cpu_fp32", "resnet18"))
        if not (r and base):
            continue
        tag = f"CPU kind: {cpu_kind}" + ("" if cpu_kind == "amx" else "; the goal is for AMX CPUs")
        speed = _goal(
            f"bf16 >= {GOAL_BF16_SPEEDUP}x fp32 samples/s for resnet18 ({setup} vs cpu_fp32; {tag})",
            r.get("speedup_vs_cpu_fp32"),
            GOAL_BF16_SPEEDUP,
            best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
        )
        mfu = _goal(f"bf16 MFU >= {GOAL_BF16_MFU:.0%} for resnet18 ({setup}; {tag})", r.get("mfu"), GOAL_BF16_MFU)
        for g in (speed, mfu):
            if cpu_kind != "amx":
                g["met"] = None  # not applicable: without AMX bf16 is expected to be slower (README)
            goals.append(g)
    return goals


def run_speedrun_if_asked(opts: BenchOptions, work: Path, with_cuda: bool) -> dict[str, Any]:
    """airbench's recipe on CIFAR-10 (benchmarks.speedrun): by default only where a GPU is visible."""
    wanted = opts.speedrun if opts.speedrun is not None else with_cuda and not opts.smoke
    if not wanted:
        return {"skipped": "no GPU visible; on a 2-core CPU the recipe takes about an hour (--speedrun runs it)"}
    opts.log("bench: CIFAR-10 time to 94% with the airbench recipe")
    return run_speedrun(opts.data_dir, work, one_gpu_env(), with_cuda, smoke=opts.smoke)


def _speedrun_goals(speedrun: dict[str, Any]) -> list[dict[str, Any]]:
    if "final_accuracy" not in speedrun:
        return []
    goal = f"airbench recipe: {TARGET_SPEEDRUN:.0%} on {speedrun['data']} (flip TTA, {speedrun['steps']} steps)"
    g = _goal(goal, speedrun["final_accuracy"], TARGET_SPEEDRUN)
    if speedrun["data"] != "CIFAR-10":
        g["met"] = None  # synthetic data says the mode works, nothing about airbench
    return [g]


def _default_run_goals(default_run: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not default_run or "process_wall_s" not in default_run:
        return []
    return [
        _goal(
            f"python scripts/train.py (defaults) <= {GOAL_DEFAULT_RUN_S:g} s from process start",
            default_run["process_wall_s"],
            GOAL_DEFAULT_RUN_S,
            higher_is_better=False,
        ),
        _goal(
            f"... with eval_accuracy >= {GOAL_DEFAULT_RUN_ACCURACY}",
            default_run.get("eval_accuracy"),
            GOAL_DEFAULT_RUN_ACCURACY,
        ),
    ]


def workloads_used(opts: BenchOptions, setups: Sequence[Setup]) -> dict[str, Any]:
    """Per workload measured: its shape, its setups, and per model the global batch and measured steps."""
    used: dict[str, Any] = {}
    for setup, model in _cells(opts, setups):
        workload = opts.workload_for(setup)
        entry = used.setdefault(
            workload.name,
            {"input_shape": [workload.channels, workload.image_size, workload.image_size], "setups": [], "models": {}},
        )
        if setup.name not in entry["setups"]:
            entry["setups"].append(setup.name)
        plan = workload.plans[model]
        entry["models"][model] = {"global_batch": plan.batch, "steps_measured": opts.steps(model, workload)}
    return used


def data_description(opts: BenchOptions, setups: Sequence[Setup]) -> str:
    by_workload: dict[str, list[str]] = {}
    for setup in setups:
        by_workload.setdefault(opts.workload_for(setup).name, []).append(setup.name)
    if len(by_workload) == 1:
        text = WORKLOADS[next(iter(by_workload))].description
    else:
        text = "; ".join(f"{WORKLOADS[w].description} ({', '.join(names)})" for w, names in by_workload.items())
    return text + ", in memory (same tensors for portable and plain)"


def run_benchmark(opts: BenchOptions) -> dict[str, Any]:
    """Measure everything and write ``benchmark.json``, ``benchmark.md`` and ``benchmark.png`` into ``opts.out``."""
    import torch

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in opts.models or ():
        if name not in MODELS:
            from accel_train.errors import UserError

            raise UserError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    select_workload("cpu", opts.workload)  # an unknown --workload fails before anything is measured
    with_cuda = torch.cuda.is_available()
    setups = _select_setups(opts, with_cuda)
    if opts.smoke:
        opts.models = ("lenet",) if opts.workload_for(SETUPS[0]).name == "mnist" else None
    for setup in setups:
        workload = opts.workload_for(setup)
        if opts.models and not _cells(opts, [setup]):
            opts.log(
                f"bench: note: {setup.name} measures the {workload.name} workload ({', '.join(workload.models)}); "
                "the --models given leave it nothing to measure"
            )
        elif setup.device == "cuda":
            opts.log(
                f"bench: {setup.name}: {workload.description} data, pinned to one GPU "
                f"(CUDA_VISIBLE_DEVICES={visible_devices(setup)}), TF32 {'on' if opts.tf32 else 'off'}"
            )
    threads = available_cores()
    opts.log(f"bench: {opts.mode} mode; measuring the machine (GEMM peak, {threads} threads)")
    machine = machine_info(threads, opts.mode, with_cuda, tf32=opts.tf32)
    machine["loadavg_start"] = [round(x, 2) for x in load_start]
    if load_start[0] > 0.5 * threads:
        opts.log(
            f"bench: note: load average {load_start[0]:.1f} on {threads} cores before starting: other processes "
            "are using the CPU, so timings will be noisy (compare the ratios)"
        )
    opts.log("bench: timing python scripts/train.py --help")
    help_timing = time_train_help(1 if opts.smoke else 3)
    work = Path(tempfile.mkdtemp(prefix="accel_bench_"))
    pool = ServerPool(work)
    try:
        wrapper = write_wrapper(work)
        raw = measure_grid(opts, setups, work, wrapper, pool)
        results = aggregate(raw, setups, machine, opts)
        study: list[dict[str, Any]] = []
        cpu_workload = opts.workload_for(SETUPS[0])
        study_models = [m for m in STUDY_MODELS if m in (opts.models or MODELS) and m in cpu_workload.plans]
        if not opts.smoke and study_models and any(s.device == "cpu" and s.processes == 1 for s in setups):
            study = run_study(study_models, opts, pool)
        pool.close()
        t2a = time_to_accuracy(opts, work) if opts.time_to_accuracy and not opts.smoke else None
        default_run = None if opts.smoke else time_default_run(work, 1 if opts.mode == "quick" else 3)
        speedrun = run_speedrun_if_asked(opts, work, with_cuda)
    finally:
        pool.close()
        if opts.keep_runs:
            opts.log(f"bench: kept the children's folders in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "machine": machine,
        "settings": {
            "mode": opts.mode,
            "repeats": opts.n_repeats(),
            "warmup_steps_excluded": WARMUP_STEPS,
            "log_every": WINDOW_STEPS,
            "workload": opts.workload,
            "workloads": workloads_used(opts, setups),
            "setups": [s.name for s in setups],
            "cells": [f"{s.name}/{m}" for s, m in _cells(opts, setups)],
            "quick_subset": opts.mode == "quick" and not opts.models and not opts.setups,
            "data": data_description(opts, setups),
            "cuda_tf32": opts.tf32 if any(s.device == "cuda" for s in setups) else None,
            "command": opts.command,
        },
        "results": results,
        "goals": evaluate_goals(results, t2a, help_timing, default_run, machine.get("cpu_bf16_kind", "unknown"))
        + _speedrun_goals(speedrun),
        "default_run": default_run,
        "bf16_study": study,
        "time_to_accuracy": t2a if t2a is not None else {"skipped": "smoke run" if opts.smoke else "disabled"},
        "speedrun": speedrun,
        "train_help_s": help_timing,
        "total_wall_s": time.perf_counter() - t_start,
    }
    (out / "benchmark.json").write_text(json.dumps(report, indent=2))
    (out / "benchmark.md").write_text(render_markdown(report))
    write_chart(report, out / "benchmark.png")
    if opts.readme is not None:
        update_readme(opts.readme, report)
        opts.log(f"bench: rewrote the benchmark block of {opts.readme}")
    opts.log(f"bench: wrote {out / 'benchmark.json'}, benchmark.md, benchmark.png in {report['total_wall_s']:.0f}s")
    return report


# --------------------------------------------------------------------------- reports


def _f(value: Any, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    return format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[met]


BF16_BACKGROUND = """\
Background (what the numbers above are consistent with; the measurements decide):

* **The bf16 arithmetic itself.** This CPU has AVX512-BF16 but AMX-BF16 is `{amx}` here. Without AMX, oneDNN
  runs `avx512_core_bf16` kernels (`vdpbf16ps`): the GEMM measured in this run gives bf16 at
  {gemm_ratio:.2f}x fp32. Large bf16-over-fp32 GEMM factors (such as ~4.8x) are what AMX tiles give; an fp32
  timing without warm-up, or taken while other processes load the CPU, can also inflate the factor. Here the two
  dtypes are timed interleaved, best of several, after a warm-up.
* **Autocast casts per op, every step.** Weights stay fp32 (the optimizer's master copy) and are cast to bf16
  in every forward, and the weight gradients come back through the cast (`cast/copy` in the profiles). For
  mnist_cnn the 25.7M-parameter dense layer makes this large, while its batch-32 matmul, bound by reading
  that weight, gains little or nothing from bf16 (compare `matmul` in the two profiles).
* **NCHW means reorders.** oneDNN computes convolutions in blocked (`nChw16c`) or NHWC layouts; NCHW tensors are
  reordered before and after each bf16 convolution (forward, backward-data, backward-weights).
  `--channels-last` keeps activations NHWC end to end and removes most of them; the study rows show what that
  is worth here, in fp32 and in bf16.
* **Small problems.** 28x28 inputs, batch 16-32 and 1-channel stems leave little work per kernel call, so
  per-op costs (casts, reorders, primitive creation, Python) weigh more than the arithmetic.
* **The optimizer does not change.** Adam updates fp32 master weights whatever the autocast dtype; for
  mnist_cnn the unfused per-parameter Adam is a large part of the step, which `torch.optim.Adam(fused=True)`
  removes (study row `fp32+fused_adam`).
"""


def _study_md(study: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for s in study:
        if "error" in s:
            lines.append(f"* {s['model']}: study failed: {s['error'][:300]}")
            continue
        lines += [
            "",
            f"**{s['model']}** (plain loop, batch {s['batch']}; all variants in one process, stepped "
            f"round-robin, {s['rounds']} round(s) x {s.get('steps_per_round', 2)} steps; medians):",
            "",
            "| variant | step ms | fwd+bwd ms | optimizer ms | speedup vs fp32 |",
            "|---|---:|---:|---:|---:|",
        ]
        for v in s["variants"]:
            lines.append(
                f"| {v['name']} | {_f(v['step_ms'])} | {_f(v['forward_backward_ms'])} | "
                f"{_f(v['optimizer_ms'])} | {_f(v.get('speedup_vs_fp32'), '.2f')}x |"
            )
        if s.get("profiles"):
            lines += ["", "Forward+backward, one profiled step (self CPU ms by category; top ops):", ""]
            for name, p in s["profiles"].items():
                cats = ", ".join(f"{k} {v:.1f}" for k, v in p["categories_ms"].items())
                top = ", ".join(f"`{k}` {ms:.1f}" for k, ms in p["top_ops_ms"][:4])
                lines.append(f"* {name}: {p['forward_backward_ms']:.1f} ms = {cats}; top: {top}")
    return lines


def _bf16_findings(report: dict[str, Any]) -> list[str]:
    """Findings written from this run's numbers."""
    index = {(r["setup"], r["model"]): r for r in report["results"]}
    m = report["machine"]
    lines = [
        f"* GEMM {m['gemm_size']}^2, {m['threads']} threads, in this run: bf16 {m['peak_gflops_bf16']:.0f} "
        f"vs fp32 {m['peak_gflops_fp32']:.0f} GFLOP/s = **{m['gemm_bf16_over_fp32']:.2f}x**; AVX512-BF16 "
        f"{'yes' if m.get('avx512_bf16') else 'no'}, AMX-BF16 {'yes' if m.get('amx_bf16') else 'no'}."
    ]
    for model in STUDY_MODELS:
        parts = [
            f"{setup} {r['speedup_vs_cpu_fp32']:.2f}x"
            for setup in ("cpu_bf16", "cpu_fp32_cl", "cpu_bf16_cl")
            if (r := index.get((setup, model))) and r.get("speedup_vs_cpu_fp32") is not None
        ]
        if parts:
            lines.append(
                f"* {model}, portable loop (scripts/train.py), samples/s relative to cpu_fp32: "
                + ", ".join(parts)
                + "."
            )
    for s in report.get("bf16_study", []):
        if "error" in s or not s.get("variants"):
            continue
        by = {v["name"]: v for v in s["variants"]}
        best = max(s["variants"], key=lambda v: v.get("speedup_vs_fp32") or 0)
        text = f"* {s['model']}, plain-loop study: fastest **{best['name']}** ({best['speedup_vs_fp32']:.2f}x fp32)"
        extras = [
            f"{name} {by[name]['speedup_vs_fp32']:.2f}x"
            for name in ("bf16", "fp32+channels_last", "bf16+channels_last")
            if name in by
        ]
        if extras:
            text += "; " + ", ".join(extras)
        if "bf16+channels_last" in by and "fp32+channels_last" in by:
            text += (
                f"; bf16 vs fp32 with both channels_last: "
                f"{by['fp32+channels_last']['step_ms'] / by['bf16+channels_last']['step_ms']:.2f}x"
            )
        lines.append(text + ".")
        prof = s.get("profiles", {})
        if "bf16" in prof and "fp32" in prof:
            pb, pf = prof["bf16"]["categories_ms"], prof["fp32"]["categories_ms"]
            lines.append(
                f"  Profile, bf16 vs fp32 (NCHW): convolutions {pb.get('convolution', 0):.1f} vs "
                f"{pf.get('convolution', 0):.1f} ms, matmuls {pb.get('matmul', 0):.1f} vs "
                f"{pf.get('matmul', 0):.1f} ms, casts/copies {pb.get('cast/copy', 0):.1f} vs "
                f"{pf.get('cast/copy', 0):.1f} ms."
            )
    verdict = _bf16_verdict(report)
    if verdict:
        lines.append(f"* **Conclusion from this run:** {verdict}")
    return lines


def _bf16_verdict(report: dict[str, Any]) -> str | None:
    study = {
        s["model"]: {v["name"]: v for v in s.get("variants", [])}
        for s in report.get("bf16_study", [])
        if "error" not in s
    }
    if not study:
        return None
    faster: dict[str, list[str]] = {}
    for model, by in study.items():  # each bf16 variant against the fastest fp32 one with the same optimizer
        faster[model] = []
        for name, v in by.items():
            rivals = [w for w in by.values() if not w.get("bf16") and bool(w.get("fused")) == bool(v.get("fused"))]
            if v.get("bf16") and rivals:
                rival = min(rivals, key=lambda w: w["step_ms"])
                if v["step_ms"] < rival["step_ms"] / 1.05:
                    faster[model].append(f"{name}: {rival['step_ms'] / v['step_ms']:.2f}x {rival['name']}")
    cl_helps = {
        model: by["bf16+channels_last"]["step_ms"] < 0.95 * by["bf16"]["step_ms"]
        for model, by in study.items()
        if "bf16" in by and "bf16+channels_last" in by
    }
    parts = []
    for model, names in faster.items():
        if names:
            parts.append(f"bf16 beats fp32 for {model} ({', '.join(names)})")
        else:
            parts.append(f"no bf16 variant beats fp32 for {model}")
    for model, helps in cl_helps.items():
        parts.append(f"channels_last {'speeds up' if helps else 'does not speed up'} bf16 for {model}")
    fused = [
        model
        for model, by in study.items()
        if "fp32+fused_adam" in by and (by["fp32+fused_adam"].get("speedup_vs_fp32") or 0) >= 1.05
    ]
    if fused:
        factors = ", ".join(f"{study[m]['fp32+fused_adam']['speedup_vs_fp32']:.2f}x" for m in fused)
        parts.append(f"fused Adam speeds up {', '.join(fused)} ({factors})")
    advice = (
        "bf16 helps for the variants listed; make them the recommendation for those models on CPUs like this one"
        if any(faster.values())
        else "keep fp32 (plus --channels-last where its row is faster) as the CPU recommendation on CPUs like this "
        "one; recommend cpu_bf16.yaml only where this benchmark shows a bf16 GEMM and step speedup (e.g. with AMX)"
    )
    rounds = min((s.get("rounds", 0) for s in report.get("bf16_study", []) if "error" not in s), default=0)
    caveat = (
        f" (from {rounds} round(s) of the study: indicative only; a run without --quick takes 8)" if rounds < 4 else ""
    )
    return "; ".join(parts) + f"{caveat}. So: {advice}."


def _ddp_findings(report: dict[str, Any]) -> list[str]:
    lines = []
    index = {(r["setup"], r["model"]): r for r in report["results"]}
    for r in report["results"]:
        if r["setup"] != "gloo_2proc" or not r.get("step_breakdown_ms"):
            continue
        b = r["step_breakdown_ms"]
        base = index.get(("cpu_fp32", r["model"]))
        text = (
            f"* {r['model']}: plain DDP step {b['total']:.1f} ms = data {b['data_wait']:.1f}, fwd+bwd "
            f"{b['forward_backward']:.1f}, gradient all-reduce ~{b['sync']:.1f}, optimizer {b['optimizer']:.1f}"
        )
        if base and base.get("step_breakdown_ms"):
            text += f" (1 process, 2 threads: {base['step_breakdown_ms']['total']:.1f} ms)"
        if r.get("scalar_allreduce_ms") is not None:
            text += (
                f"; one scalar all-reduce costs {r['scalar_allreduce_ms']:.2f} ms (the loop does one every 10 steps "
                "to agree on stop signals)"
            )
        lines.append(text + ".")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        "# accel_train benchmark",
        "",
        f"Mode **{s['mode']}**: {s['repeats']} repeat(s) per measurement (median), {s['warmup_steps_excluded']} "
        f"warm-up steps excluded. Machine: {m['cpu']}, {m['cores']} core(s), torch {m['torch']}, accelerate "
        f"{m['accelerate']}, Python {m['python']}. GEMM peak ({m['gemm_size']}^2, {m['threads']} threads): fp32 "
        f"{m['peak_gflops_fp32']:.0f} GFLOP/s, bf16 {m['peak_gflops_bf16']:.0f} GFLOP/s. Load average at start "
        f"{m.get('loadavg_start')}, at end {m.get('loadavg_end')}: when other processes share the CPU, absolute "
        "numbers are noisy; each plain measurement is taken right next to its portable run and the RATIO is the "
        f"result. Total time {report['total_wall_s']:.0f} s.",
        *_gpu_md(m),
        "",
        "## Throughput: portable loop vs plain PyTorch loop",
        "",
        *(
            [
                f"`--quick` measures a subset of the cells ({', '.join(s['cells'])}); a run without `--quick` measures "
                "every model on every setup, with repeats.",
                "",
            ]
            if s.get("quick_subset")
            else []
        ),
        f"Data: {s['data']}. *Portable*: `scripts/train.py` launched as users do (commands below), steady-state "
        "samples/s and data wait from its summary.json. *Plain*: a hand-written loop in its own process (same model, "
        "data, global batch, threads; Adam, cross-entropy and the loop's default grad-norm clipping; like the "
        f"portable loop it waits for the device only at log points, every {WINDOW_STEPS} steps). *best win.*: "
        f"ratio of the best {WINDOW_STEPS}-step windows of both sides (only with >= {2 * WINDOW_STEPS} steps). "
        "*Breakdown*: plain loop, ms per step: data / forward+backward / optimizer / gradient all-reduce (DDP: "
        "synced minus no_sync backward; on CUDA from extra steps synced after each phase). MFU: FLOPs of "
        "forward+backward (FlopCounterMode) x samples/s over the GEMM "
        "peak of the same dtype. *load*: highest 1-minute load average around the portable run(s) (this "
        f"benchmark's own threads count; {m['cores']} cores).",
        "",
    ]
    lines += _results_table(report)
    errors = [(r["model"], r["setup"], e) for r in report["results"] for e in r.get("errors", [])]
    if errors:
        lines += ["", "Errors:", ""] + [f"* {mo} / {se}: {e[:400]}" for mo, se, e in errors]
    lines += ["", "Portable commands (OUT: a temporary run folder):", ""]
    seen = set()
    for r in report["results"]:
        if r.get("command") and r["setup"] not in seen:
            seen.add(r["setup"])
            lines.append(f"* {r['setup']}: `{r['command']}`")
    lines += ["", "## Goals (reported, not asserted)", "", *_goals_table(report)]
    lines += _t2a_md(report.get("time_to_accuracy") or {})
    lines += ["", *speedrun_markdown(report.get("speedrun") or {"skipped": "not in this report"})]
    lines += _rest_of_report(report)
    return "\n".join(lines) + "\n"


def _results_table(report: dict[str, Any]) -> list[str]:
    gpu_mem = any(r.get("peak_memory_mb") or r.get("plain_peak_memory_mb") for r in report["results"])
    lines = [
        "| model | setup | batch | portable samples/s | plain samples/s | ratio | best win. | data wait | "
        "breakdown ms | GFLOP/s | MFU | peak RSS MB | load |" + (" peak GPU MB portable/plain |" if gpu_mem else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|" if gpu_mem else ""),
    ]
    for r in report["results"]:
        b = r.get("step_breakdown_ms") or {}
        bd = "/".join(_f(b.get(k), ".1f") for k in ("data_wait", "forward_backward", "optimizer", "sync")) if b else "-"
        mem = f" {_f(r.get('peak_memory_mb'), '.0f')}/{_f(r.get('plain_peak_memory_mb'), '.0f')} |" if gpu_mem else ""
        lines.append(
            f"| {r['model']} | {r['setup']} | {r['global_batch']} | {_f(r['samples_per_s'], '.0f')} | "
            f"{_f(r['plain_samples_per_s'], '.0f')} | {_f(r['ratio_vs_plain'], '.3f')} | "
            f"{_f(r.get('ratio_vs_plain_best_window'), '.3f')} | {_pct(r['data_wait_fraction'])} | {bd} | "
            f"{_f(r['achieved_gflops'], '.1f')} | {_pct(r['mfu'])} | {_f(r['peak_rss_mb'], '.0f')} | "
            f"{_f(r.get('loadavg_1min'), '.1f')} |{mem}"
        )
    return lines


def _goals_table(report: dict[str, Any]) -> list[str]:
    lines = ["| goal | measured | best windows | met |", "|---|---:|---:|---|"]
    for g in report["goals"]:
        lines.append(
            f"| {g['goal']} | {_f(g['value'], '.3f')} | {_f(g.get('value_best_window'), '.3f')} | {_met(g['met'])} |"
        )
    return lines


def _rest_of_report(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    help_t = report.get("train_help_s", {})
    lines = [
        "",
        f"`python scripts/train.py --help`: {_f(help_t.get('median_s'), '.2f')} s (median of "
        f"{len(help_t.get('runs_s', []))}).",
    ]
    lines += _default_run_md(report.get("default_run"))
    ddp = _ddp_findings(report)
    if ddp:
        lines += ["", "## 2 gloo processes on this CPU", ""] + ddp
    lines += ["", "## bf16 on this CPU", ""] + _bf16_findings(report) + _study_md(report.get("bf16_study", []))
    lines += ["", BF16_BACKGROUND.format(amx="yes" if m.get("amx_bf16") else "no", gemm_ratio=m["gemm_bf16_over_fp32"])]
    return lines


README_BEGIN = "<!-- benchmark:begin"
README_END = "<!-- benchmark:end -->"


def readme_block(report: dict[str, Any]) -> str:
    """The README's benchmark figures, written from ``report`` (``--readme``): nobody copies numbers by hand."""
    m, s = report["machine"], report["settings"]
    kind = m.get("cpu_bf16_kind", "unknown")
    lines = [
        f"{README_BEGIN}: written by `{s.get('command', 'python scripts/benchmark.py')}`; rerun it, do not edit -->",
        f"Latest run (`{s.get('command', 'python scripts/benchmark.py')}`, {report['total_wall_s']:.0f} s, "
        f"{m['cores']}-core **{m['cpu']}, CPU kind `{kind}`** (AMX: {'yes' if m.get('amx_bf16') else 'no'}), "
        f"torch {m['torch']}, accelerate {m['accelerate']}; the whole report, JSON and chart are in "
        "[`docs/benchmark/`](docs/benchmark/benchmark.md)). *portable*: `scripts/train.py` launched as users launch "
        "it; *plain*: a hand-written loop with the same model, in-memory data, batch and threads, measured right "
        "before and after it. The breakdown is the plain loop's ms per step: data / forward+backward / optimizer / "
        "gradient all-reduce.",
        "",
        *_results_table(report),
        "",
        *_goals_table(report),
    ]
    run = report.get("default_run")
    if run and "error" not in run:
        lines += [
            "",
            f"The default run (`{run['command']}`, median of {len(run['runs_s'])} in the same benchmark run), "
            "from process start:",
            "",
            *_default_run_md(run)[-3:],
        ]
    return "\n".join([*lines, README_END])


def update_readme(path: Path, report: dict[str, Any]) -> None:
    """Replace the block between the benchmark markers of ``path`` with :func:`readme_block`."""
    text = path.read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        from accel_train.errors import UserError

        raise UserError(f"{path} has no '{README_BEGIN} ... {README_END}' block for --readme to replace")
    path.write_text(text[:begin] + readme_block(report) + text[end + len(README_END) :])


def _default_run_md(run: dict[str, Any] | None) -> list[str]:
    if not run:
        return []
    if "error" in run:
        return ["", "## The default run", "", f"failed: {run['error']}"]
    return [
        "",
        "## The default run, from process start",
        "",
        f"`{run['command']}` (lenet on digits, 8 epochs): **{run['process_wall_s']:.1f} s** "
        f"(median of {len(run['runs_s'])}: {', '.join(f'{x:.1f}' for x in run['runs_s'])}), "
        f"eval_accuracy {_f(run.get('eval_accuracy'), '.4f')}.",
        "",
        "| interpreter, imports, arguments | set-up (data, model, Accelerator, run folder) | training, evaluations, "
        "export (to the last metrics event) | after it (plots, summary) |",
        "|---:|---:|---:|---:|",
        f"| {run['before_fit_s']:.2f} s | {run['setup_s']:.2f} s | {run['train_s']:.2f} s | {run['finish_s']:.2f} s |",
    ]


def _gpu_md(m: dict[str, Any]) -> list[str]:
    """What the CUDA rows mean: which GPU, which precision, which peak."""
    if not m.get("cuda"):
        return []
    flags = m.get("cuda_precision_flags") or {}
    tf32 = m.get("cuda_tf32")
    return [
        "",
        f"GPU: {m['cuda']} ({m.get('cuda_device_count', '?')} visible to the benchmark). Every CUDA run is pinned "
        f"to ONE GPU: `CUDA_VISIBLE_DEVICES={m.get('cuda_pinned_device')}` in the environment of the portable and "
        "the plain loop (the GPU the GEMM peak ran on), so the portable loop never wraps the model in "
        "`nn.DataParallel`, as it does when one process sees several GPUs. Precision: TF32 "
        f"**{'on' if tf32 else 'off'}** for matmuls AND convolutions (`torch.backends.cuda.matmul.allow_tf32="
        f"{flags.get('matmul_allow_tf32')}`, `torch.backends.cudnn.allow_tf32={flags.get('cudnn_allow_tf32')}`), "
        "set the same way for the GEMM peak, the plain loop and the portable loop (the portable through the "
        "benchmark's wrapper; the flags it ended with are checked). PyTorch's defaults differ (matmuls off, "
        "convolutions on): an fp32 peak taken with them is a true-fp32 peak while the convolutions run in TF32. "
        + (
            "With TF32 on, `cuda_fp32` means fp32 storage with TF32 tensor-core math, what a ResNet gets by "
            "default anyway (its FLOPs are convolutions), and its MFU is over the TF32 GEMM peak "
            if tf32
            else "With TF32 off (`--no-tf32`), `cuda_fp32` is strict fp32 math and its MFU is over the fp32 GEMM peak "
        )
        + f"({_f(m.get('peak_gflops_fp32_cuda'), '.0f')} GFLOP/s; bf16: {_f(m.get('peak_gflops_bf16_cuda'), '.0f')}).",
    ]


def _t2a_md(t2a: dict[str, Any]) -> list[str]:
    lines = ["", f"## Time to {TARGET_ACCURACY:.0%} test accuracy, from launch", ""]
    if "skipped" in t2a:
        return lines + [f"Skipped: {t2a['skipped']}."]
    lines += [
        "| dataset | recipe | reached | seconds from launch | at | best accuracy |",
        "|---|---|---|---:|---|---:|",
    ]
    for ds in ("digits", "mnist"):
        entry = t2a.get(ds)
        if not entry:
            continue
        if "skipped" in entry:
            lines.append(f"| {ds} | - | skipped: {entry['skipped']} | - | - | - |")
            continue
        for name in ("portable", "seed000"):
            e = entry[name]
            if e.get("reached"):
                at = f"step {e.get('step')}, epoch {e.get('epoch')}" if name == "portable" else f"epoch {e['epoch']}"
            else:
                at = e.get("stopped") or str(e.get("error", "-"))[:80]
            lines.append(
                f"| {ds} | {name} | {'yes' if e.get('reached') else 'no'} | "
                f"{_f(e.get('time_to_target_s'))} | {at} | {_f(e.get('best_accuracy'), '.4f')} |"
            )
        if entry.get("speedup") is not None:
            bound = ">= " if entry.get("speedup_is_lower_bound") else ""
            lines.append(f"| {ds} | **speedup** | | {bound}{entry['speedup']:.1f}x | | |")
    digits = t2a.get("digits") or {}
    portable = digits.get("portable") or {}
    if portable.get("reached") and portable.get("train_time_to_target_s") is not None:
        startup = portable["time_to_target_s"] - portable["train_time_to_target_s"]
        lines += [
            "",
            f"Of the portable loop's {portable['time_to_target_s']:.1f} s, {startup:.1f} s pass before its "
            "run "
            "logger starts (interpreter, imports, dataset, model, Accelerator); training and evaluation "
            f"to {TARGET_ACCURACY:.0%} take {portable['train_time_to_target_s']:.1f} s.",
        ]
    if digits.get("seed000", {}).get("recipe"):
        epochs = ", ".join(
            f"{e['epoch']}: {e['accuracy']:.3f} @ {e['time_s']:.0f}s" for e in digits["seed000"].get("epochs", [])
        )
        lines += [
            "",
            f"seed-000 recipe: {digits['seed000']['recipe']}; per epoch: {epochs or '-'}.",
            f"Portable: {digits.get('portable', {}).get('recipe', '')}, `--eval-every 5`; "
            f"`{digits.get('portable', {}).get('command', '')}`. Caps: {t2a.get('caps')}.",
        ]
    return lines


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"]]
    labels = [f"{r['model']}\n{r['setup']}" for r in rows]
    portable = [r["samples_per_s"] or 0.0 for r in rows]
    plain = [r["plain_samples_per_s"] or 0.0 for r in rows]
    ratio = [r["ratio_vs_plain"] or 0.0 for r in rows]
    x = list(range(len(rows)))
    width = 0.4
    fig, (ax1, ax2) = plt.subplots(
        2, 1, figsize=(max(8.0, 0.9 * len(rows) + 2), 8), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    ax1.bar([i - width / 2 for i in x], portable, width, label="portable loop (scripts/train.py)")
    ax1.bar([i + width / 2 for i in x], plain, width, label="plain PyTorch loop")
    if any(v > 0 for v in portable + plain):
        ax1.set_yscale("log")
    ax1.set_ylabel("samples/s (log)")
    ax1.set_title(f"accel_train benchmark ({report['settings']['mode']}) - {report['machine']['cpu']}")
    ax1.legend()
    colors = ["tab:green" if v >= GOAL_RATIO_VS_PLAIN else "tab:red" for v in ratio]
    ax2.bar(x, ratio, 0.6, color=colors)
    ax2.axhline(GOAL_RATIO_VS_PLAIN, color="black", linestyle="--", linewidth=1, label=f"goal {GOAL_RATIO_VS_PLAIN}")
    ax2.axhline(1.0, color="grey", linewidth=0.8)
    ax2.set_ylabel("portable / plain")
    ax2.legend(loc="lower right")
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- child entry point


def _child_main(argv: Sequence[str]) -> None:
    kind, spec_path = argv[1], argv[2]
    spec = _load_json(Path(spec_path))
    {"server": _child_server, "seed000": _child_seed000}[kind](spec)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child_main(sys.argv[1:])
    else:
        sys.exit("usage: python -m benchmarks --help (this module's command line is for its children)")
