"""What the benchmark measures: the setups (processes, precision, memory format, device), the workloads (the
synthetic data's shape, and per model the global batch and the measured steps), the cells ``--quick`` keeps,
and one run's options (``BenchOptions``), with the step counts the portable and the plain loop share."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from accel_train.config import TrainConfig
from accel_train.doctor.launching import REPO
from accel_train.trainer import WARMUP_STEPS_EXCLUDED

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
    speedrun: bool | None = None  # CIFAR-10 time to 94% (benchmarks.speed.speedrun); None: where a GPU is visible
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


def synthetic_size(batch: int, total_steps: int) -> int:
    """One spare batch: the measured steps never reach an epoch end (no epoch-end evaluation)."""
    return batch * (total_steps + 1)
