#!/usr/bin/env python
"""GPU acceptance: run every GPU check of accel_train on this machine and write down what happened.

    python scripts/gpu_acceptance.py --plan          # list the checks with their exact commands; needs no GPU
    python scripts/gpu_acceptance.py                 # run them (about 10-25 minutes on one H100)
    python scripts/gpu_acceptance.py --wheels DIR    # first pip-install requirements.txt from the wheels in DIR

The checks:
  (a) pytest      ``pytest -m "gpu or multigpu"``: tests/test_gpu.py and every other GPU-marked test
  (b) throughput  resnet18 on CIFAR-shaped synthetic data, batch 512, in fp32, bf16 and fp16: samples/s, MFU
                  against this GPU's measured bf16 GEMM peak, peak memory, fp16 skipped steps
  (c) resume      stopped at a step on the GPU and resumed: the weights equal an uninterrupted run's
  (d) fsdp        fsdp.yaml at world size 1 on resnet18 (BatchNorm): save, resume, full-weights export
  (e) dp_ddp      DataParallel (dp.yaml, GPUs 0,1) and DDP (multi_gpu.yaml, 2 processes): the same weights
  (f) speedrun    airbench's CIFAR-10 recipe (configs/airbench_cifar10.yaml, bf16) at full length on synthetic
                  CIFAR-shaped data: training seconds for the FLOPs airbench publishes 5.5 A100-seconds for

It writes docs/gpu/acceptance.json and docs/gpu/acceptance.md (``--out``): per check pass, fail or not run with
the reason, its duration and numbers, plus the device, versions, git commit and date. A check that could not
run (one GPU for (e), the time budget spent) is "not run", never "pass". Each check has a timeout, and all of
them share ``--budget-min``. Runs and logs go to runs/gpu_acceptance/<time>/.

Exit codes: 0 no check failed, 1 a check failed, 2 this machine cannot run the checks (no CUDA GPU, missing
packages: the line says what to do).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "gpu"
DEFAULT_WORK = REPO / "runs" / "gpu_acceptance"
PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
CHECK_NAMES = ("pytest", "throughput", "resume", "fsdp", "dp_ddp", "speedrun")

# import name -> what pip installs (requirements.txt, plus pytest for check (a))
REQUIRED = {
    "torch": "torch",
    "torchvision": "torchvision",
    "accelerate": "accelerate",
    "datasets": "datasets",
    "evaluate": "evaluate",
    "safetensors": "safetensors",
    "sklearn": "scikit-learn",
    "tqdm": "tqdm",
    "tensorboard": "tensorboard",
    "matplotlib": "matplotlib",
    "yaml": "pyyaml",
    "PIL": "pillow",
    "pytest": "pytest",
}
_REEXEC = "ACCEL_TRAIN_ACCEPTANCE_REEXEC"  # set for the re-started script: packages installed, PYTHONPATH set

FAST = ["--report-to", "none", "--no-plots", "--no-progress"]
# For comparisons: no TF32 (fp32 stays fp32), cuBLAS kernels that give the same result every time.
DETERMINISTIC = {"NVIDIA_TF32_OVERRIDE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
CIFAR_SHAPED = ["--dataset", "synthetic", "--synthetic-channels", "3", "--synthetic-image-size", "32"]
THROUGHPUT_BATCH, THROUGHPUT_STEPS = 512, 300
PRECISIONS = ("fp32", "bf16", "fp16")
# SGD: a weight then differs by lr x round-off, while a resume mistake moves it by lr x a whole gradient.
SGD = ["--optimizer", "sgd", "--lr", "0.05"]
RESUME_TOL = 1e-5  # one GPU, same kernels: bitwise unless cuDNN picked an atomics-based (non-deterministic) kernel
DP_DDP_TOL = 1e-5  # the same fp32 math on two GPUs, only the gradient sum is split differently
FP16_MAX_SKIPPED = 0.1  # more overflowed steps than this share means the loss scale never settled
GEMM_N, GEMM_TRIALS, GEMM_PER_TRIAL = 8192, 10, 5
MIN_CHECK_S = 60  # a check is not started with less time than this left in the budget
SPEEDRUN_STEPS = 648  # configs/airbench_cifar10.yaml's max_steps (13.5 epochs of 48 batches of 1024)
SPEEDRUN_PUBLISHED_S = 5.5  # airbench's A100 seconds for that recipe (benchmarks/speedrun.py, PUBLISHED)


class SetupError(Exception):
    """This machine cannot run the checks; the message says what to do. Exit code 2."""


# ---- the checks: what runs, and what passes -------------------------------------------------------------------
@dataclass
class Step:
    """One child process of a check; ``env`` is added to ``accel_train.launch.child_env()``."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    out_dir: Path | None = None
    must_succeed: bool = True  # False: the judge reads the output whatever the exit code (pytest)

    def shell(self) -> str:
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, shlex.join(self.argv)])


@dataclass
class CheckResult:
    name: str
    status: str  # PASS, FAIL or NOT_RUN
    detail: str = ""  # one line: what it measured, why it failed, or why it did not run
    duration_s: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    log_dir: str | None = None


Judge = Callable[["Context", dict[str, subprocess.CompletedProcess], "Check"], tuple[bool, str, dict[str, Any]]]


@dataclass
class Check:
    name: str
    title: str
    passes_when: str
    timeout_s: int
    steps: list[Step]
    judge: Judge
    min_gpus: int = 1
    in_process: str = ""  # what the parent process measures itself, for the plan

    def step(self, label: str) -> Step:
        return next(s for s in self.steps if s.label == label)


@dataclass
class Context:
    work: Path
    out: Path
    gpus: int | None  # None: unknown (a plan on a machine without torch)
    budget_s: float
    peak_tflops: float | None = None


def _train(
    label: str, ctx: Context, check: str, *args: str, run: str | None = None, config=None, launch_args=(), env=None
):
    """A ``scripts/train.py`` step writing to ``work/<check>/<run or label>``."""
    from accel_train.launch import script_cmd

    out = ctx.work / check / (run or label)
    argv = script_cmd("train.py", *args, *FAST, "--output-dir", str(out), config=config, launch_args=launch_args)
    return Step(label, argv, dict(env or {}), out)


def pytest_check(ctx: Context) -> Check:
    # one process (no xdist workers): the GPU tests share one device and report its timings
    argv = [sys.executable, "-m", "pytest", "-m", "gpu or multigpu", "-q", "-p", "no:cacheprovider"]
    argv += ["-p", "no:xdist", "tests"]
    return Check(
        "pytest",
        "the GPU-marked tests (tests/test_gpu.py and others)",
        "pytest exits 0, at least one test passed and none failed or errored (multigpu tests skip on one GPU)",
        900,
        [Step("pytest", argv, must_succeed=False)],
        _judge_pytest,
    )


def throughput_check(ctx: Context) -> Check:
    data = [*CIFAR_SHAPED, "--synthetic-size", str(THROUGHPUT_BATCH * 100), "--synthetic-test-size", "2560"]
    args = ["--model", "resnet18", *data, "--batch-size", str(THROUGHPUT_BATCH), "--max-steps", str(THROUGHPUT_STEPS)]
    args += ["--log-every", "25", "--no-checkpoint-epochs"]  # a log syncs the GPU: the host clock stays honest
    steps = [
        _train(p, ctx, "throughput", *args, "--mixed-precision", "no" if p == "fp32" else p, config="single_gpu.yaml")
        for p in PRECISIONS
    ]
    return Check(
        "throughput",
        f"resnet18, CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}, {THROUGHPUT_STEPS} steps in fp32/bf16/fp16",
        "every run finishes with a finite loss and the asked precision; fp16 skips at most "
        f"{FP16_MAX_SKIPPED:.0%} of its steps (samples/s, MFU and memory are reported, not judged)",
        600,
        steps,
        _judge_throughput,
        in_process=f"bf16 GEMM peak ({GEMM_N}^3 matmuls, best of {GEMM_TRIALS} x {GEMM_PER_TRIAL}, CUDA events); "
        "resnet18's FLOPs per sample (FlopCounterMode, forward x3 for a training step); MFU = achieved / peak",
    )


def resume_check(ctx: Context) -> Check:
    args = ["--model", "mnist_cnn", *SGD, "--batch-size", "64", "--max-steps", "40", "--log-every", "5"]
    gpu = "single_gpu.yaml"
    straight = _train("straight", ctx, "resume", *args, config=gpu, env=DETERMINISTIC)
    # one run folder: stopped, then resumed
    stop = _train("stopped", ctx, "resume", *args, "--stop-at-step", "17", run="resumed", config=gpu, env=DETERMINISTIC)
    resume = _train("resumed", ctx, "resume", *args, "--resume", "auto", config=gpu, env=DETERMINISTIC)
    return Check(
        "resume",
        "mnist_cnn (dropout: the CUDA RNG state) stopped at step 17 and resumed to 40, vs straight to 40",
        f"all runs exit 0, the resume says so, and the weights are within {RESUME_TOL:g} of the straight run's "
        "(bitwise is reported)",
        300,
        [straight, stop, resume],
        _judge_resume,
    )


def fsdp_check(ctx: Context) -> Check:
    args = ["--model", "resnet18", *CIFAR_SHAPED, "--synthetic-size", "512", "--synthetic-test-size", "128"]
    args += ["--batch-size", "32", "--max-steps", "12", "--log-every", "1"]
    one = ("--num_processes", "1")
    plain = _train("plain", ctx, "fsdp", *args, "--mixed-precision", "bf16", config="single_gpu.yaml")
    straight = _train("straight", ctx, "fsdp", *args, config="fsdp.yaml", launch_args=one)
    stop = _train(
        "stopped", ctx, "fsdp", *args, "--stop-at-step", "5", run="resumed", config="fsdp.yaml", launch_args=one
    )
    resume = _train("resumed", ctx, "fsdp", *args, "--resume", "auto", config="fsdp.yaml", launch_args=one)
    return Check(
        "fsdp",
        "fsdp.yaml (bf16) at world size 1 on resnet18: sharded checkpoint at step 5, resume to 12, export",
        "all runs exit 0, the resume says so, and model/model.safetensors holds full tensors with the plain run's "
        "keys, shapes and dtypes (the difference from the straight FSDP run is reported)",
        600,
        [plain, straight, stop, resume],
        _judge_fsdp,
    )


def dp_ddp_check(ctx: Context) -> Check:
    args = ["--model", "lenet", *SGD, "--global-batch-size", "32", "--max-steps", "20", "--log-every", "1"]
    gpus01 = ("--gpu_ids", "0,1")
    dp = _train("dp", ctx, "dp_ddp", *args, config="dp.yaml", launch_args=gpus01, env=DETERMINISTIC)
    ddp = _train(
        "ddp", ctx, "dp_ddp", *args, config="multi_gpu.yaml", launch_args=("--num_processes", "2", *gpus01),
        env=DETERMINISTIC,
    )  # fmt: skip
    return Check(
        "dp_ddp",
        "DataParallel (1 process, GPUs 0,1) vs DDP (2 processes), lenet, global batch 32, 20 steps",
        f"both exit 0 and their weights are within {DP_DDP_TOL:g}",
        420,
        [dp, ddp],
        _judge_dp_ddp,
        min_gpus=2,
    )


def speedrun_check(ctx: Context) -> Check:
    recipe = str(REPO / "configs" / "airbench_cifar10.yaml")
    data = [*CIFAR_SHAPED, "--synthetic-size", "50000", "--synthetic-test-size", "10000"]  # CIFAR-10's sizes
    args = ["--config", recipe, *data, "--mixed-precision", "bf16"]
    step = _train("bf16", ctx, "speedrun", *args, config="single_gpu.yaml")
    return Check(
        "speedrun",
        f"airbench's recipe, full length ({SPEEDRUN_STEPS} steps of 1024), bf16, on synthetic CIFAR-shaped 50k/10k "
        "images",
        f"the run exits 0 on the GPU with {SPEEDRUN_STEPS} steps, a finite loss and the data on the device (training "
        f"seconds, samples/s and start-up are reported beside airbench's published {SPEEDRUN_PUBLISHED_S} "
        "A100-seconds for the same FLOPs; "
        "accuracy on synthetic data says nothing: python -m benchmarks.speedrun --data-dir DIR with CIFAR-10)",
        420,
        [step],
        _judge_speedrun,
    )


def build_checks(ctx: Context) -> list[Check]:
    checks = [pytest_check(ctx), throughput_check(ctx), resume_check(ctx), fsdp_check(ctx), dp_ddp_check(ctx)]
    checks.append(speedrun_check(ctx))
    assert tuple(c.name for c in checks) == CHECK_NAMES
    return checks


# ---- judging what the runs wrote ------------------------------------------------------------------------------
def _summary(step: Step) -> dict[str, Any]:
    return json.loads((step.out_dir / "summary.json").read_text())


def _weights(step: Step) -> dict:
    from safetensors.torch import load_file

    return load_file(str(step.out_dir / "model" / "model.safetensors"))


def _max_abs_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _judge_pytest(ctx, procs, check):
    proc = procs["pytest"]
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", tail):
        counts["errors" if word.startswith("error") else word] = int(n)
    ok = proc.returncode == 0 and counts["passed"] > 0 and counts["failed"] == counts["errors"] == 0
    detail = f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
    detail += f"{counts['skipped']} skipped (pytest exit {proc.returncode})"
    return ok, detail, counts


def model_train_flops_per_sample(model: str = "resnet18", channels: int = 3, size: int = 32) -> float:
    """FLOPs of one training step per sample: the forward pass counted by FlopCounterMode, times 3."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from accel_train.models import create_model

    with torch.device("meta"):
        net = create_model(model, num_classes=10, in_channels=channels, image_size=size)
        x = torch.randn(8, channels, size, size)
    with FlopCounterMode(display=False) as counter:
        net(x)
    return 3.0 * counter.get_total_flops() / 8


def bf16_gemm_peak_tflops(n: int = GEMM_N, trials: int = GEMM_TRIALS, per_trial: int = GEMM_PER_TRIAL) -> float:
    """This GPU's bf16 matmul rate: best of ``trials`` timings of ``per_trial`` n^3 products (CUDA events)."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(3):  # warm-up: kernel choice, clocks
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_trial):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / per_trial)
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * n**3 / best / 1e12


def _judge_throughput(ctx, procs, check):
    if ctx.peak_tflops is None:
        ctx.peak_tflops = bf16_gemm_peak_tflops()
    flops = model_train_flops_per_sample()
    runs, problems = {}, []
    for precision in PRECISIONS:
        s = _summary(check.step(precision))
        rate = s.get("train_samples_per_s") or 0.0
        runs[precision] = {
            "samples_per_s": round(rate, 1),
            "mfu": round(flops * rate / (ctx.peak_tflops * 1e12), 4),
            "achieved_tflops": round(flops * rate / 1e12, 2),
            "peak_memory_mb": s.get("peak_memory_mb"),
            "data_wait_fraction": s.get("data_wait_fraction"),
            "fp16_skipped_steps": s.get("fp16_skipped_steps"),
            "loss_scale": s.get("loss_scale"),
            "eval_loss": s.get("eval_loss"),
            "mixed_precision": s.get("mixed_precision"),
            "global_step": s.get("global_step"),
        }
        problems += _throughput_problems(precision, s)
    fp32 = runs["fp32"]["samples_per_s"]
    speedups = {p: round(runs[p]["samples_per_s"] / fp32, 3) for p in PRECISIONS[1:]} if fp32 else {}
    metrics = {"peak_bf16_tflops": round(ctx.peak_tflops, 1), "train_flops_per_sample": flops, "runs": runs}
    metrics["speedup_vs_fp32"] = speedups
    best = max(PRECISIONS, key=lambda p: runs[p]["samples_per_s"])
    detail = "; ".join(problems) or (
        f"best {best}: {runs[best]['samples_per_s']:,.0f} samples/s, MFU {runs[best]['mfu']:.1%} of the measured "
        f"{ctx.peak_tflops:.0f} TFLOP/s bf16 peak"
    )
    return not problems, detail, metrics


def _throughput_problems(precision: str, s: dict[str, Any]) -> list[str]:
    problems = []
    if s.get("mixed_precision") != ("no" if precision == "fp32" else precision):
        problems.append(f"{precision}: summary says mixed_precision {s.get('mixed_precision')!r}")
    if not (isinstance(s.get("eval_loss"), float) and math.isfinite(s["eval_loss"])):
        problems.append(f"{precision}: eval_loss {s.get('eval_loss')!r} is not finite")
    if not s.get("train_samples_per_s"):
        problems.append(f"{precision}: no train_samples_per_s in summary.json")
    if not str(s.get("device", "")).startswith("cuda"):
        problems.append(f"{precision}: ran on {s.get('device')!r}, not a GPU")
    skipped = s.get("fp16_skipped_steps")
    if precision == "fp16" and not isinstance(skipped, int):
        problems.append(f"fp16: fp16_skipped_steps is {skipped!r}, not a count")
    elif precision == "fp16" and skipped > FP16_MAX_SKIPPED * (s.get("global_step") or 0):
        problems.append(f"fp16: {skipped} of {s.get('global_step')} steps overflowed and were skipped")
    return problems


def _judge_resume(ctx, procs, check):
    straight, resumed = check.step("straight"), check.step("resumed")
    diff = _max_abs_diff(_weights(straight), _weights(resumed))
    said = "resumed from" in procs["resumed"].stdout
    steps = (_summary(straight)["global_step"], _summary(resumed)["global_step"])
    metrics = {"max_abs_diff": diff, "bitwise": diff == 0.0, "resume_reported": said, "global_steps": steps}
    ok = said and steps == (40, 40) and diff <= RESUME_TOL
    detail = f"max |w_resumed - w_straight| = {diff:.3g} ({'bitwise' if diff == 0 else 'not bitwise'})"
    if not said:
        detail += "; the resumed run did not say 'resumed from'"
    if steps != (40, 40):
        detail += f"; global steps {steps}, expected 40 and 40"
    return ok, detail, metrics


def _judge_fsdp(ctx, procs, check):
    plain, fsdp = _weights(check.step("plain")), _weights(check.step("resumed"))
    s = _summary(check.step("resumed"))
    problems = []
    if "resumed from" not in procs["resumed"].stdout:
        problems.append("the resumed run did not say 'resumed from'")
    if (s.get("distributed_type"), s.get("global_step")) != ("FSDP", 12):
        problems.append(f"summary: distributed_type {s.get('distributed_type')!r}, step {s.get('global_step')}")
    if plain.keys() != fsdp.keys():
        problems.append(f"keys differ from the plain run's: {sorted(plain.keys() ^ fsdp.keys())[:6]}")
    else:
        bad = [k for k in plain if (plain[k].shape, plain[k].dtype) != (fsdp[k].shape, fsdp[k].dtype)]
        problems += [f"{k}: {tuple(fsdp[k].shape)} {fsdp[k].dtype}, plain {tuple(plain[k].shape)}" for k in bad[:3]]
    diff = _max_abs_diff(_weights(check.step("straight")), fsdp) if not problems else None
    metrics = {"tensors": len(fsdp), "max_abs_diff_vs_straight_fsdp": diff, "peak_memory_mb": s.get("peak_memory_mb")}
    detail = "; ".join(problems) or f"{len(fsdp)} full tensors; max |w_resumed - w_straight| = {diff:.3g} (reported)"
    return not problems, detail, metrics


def _judge_dp_ddp(ctx, procs, check):
    dp, ddp = _summary(check.step("dp")), _summary(check.step("ddp"))
    diff = _max_abs_diff(_weights(check.step("dp")), _weights(check.step("ddp")))
    layout = (dp.get("data_parallel"), dp.get("world_size"), ddp.get("world_size"))
    ok = layout == (True, 1, 2) and diff <= DP_DDP_TOL
    detail = f"max |w_dp - w_ddp| = {diff:.3g}"
    if layout != (True, 1, 2):
        detail += f"; expected DataParallel on 1 process and DDP on 2, got {layout}"
    return ok, detail, {"max_abs_diff": diff, "dp_world_size": layout[1], "ddp_world_size": layout[2]}


def _judge_speedrun(ctx, procs, check):
    import yaml

    step = check.step("bf16")
    s = _summary(step)
    resolved = yaml.safe_load((step.out_dir / "config.yaml").read_text()).get("resolved", {})
    problems = _throughput_problems("bf16", s)
    if s.get("global_step") != SPEEDRUN_STEPS:
        problems.append(f"{s.get('global_step')} steps, expected {SPEEDRUN_STEPS}")
    if not resolved.get("data_on_device"):
        problems.append("the dataset was not placed on the GPU (resolved.data_on_device is false)")
    metrics = {
        "train_time_s": s.get("train_time_s"),
        "setup_s": s.get("setup_s"),
        "wall_time_s": s.get("wall_time_s"),
        "samples_per_s": s.get("train_samples_per_s"),
        "peak_memory_mb": s.get("peak_memory_mb"),
        "channels_last": resolved.get("channels_last"),
        "airbench_published_a100_train_s": SPEEDRUN_PUBLISHED_S,
    }
    detail = "; ".join(problems) or (
        f"{SPEEDRUN_STEPS} steps in {s['train_time_s']:.2f} s of training ({s['train_samples_per_s']:,.0f} "
        f"samples/s), {s['setup_s']:.1f} s start-up; airbench publishes {SPEEDRUN_PUBLISHED_S} s on an A100 for "
        "this recipe"
    )
    return not problems, detail, metrics


# ---- running ----------------------------------------------------------------------------------------------------
# accel_train's one-line errors first, then the last exception line (not torchrun's ChildFailedError wrapper)
_WHY = (r"^(\[rank \d+\] )?error: (?!unexpected failure)", r"^[\w.]*(Error|Exception)\b")


def _why(text: str) -> str:
    """The most telling line of a failed run's output."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and set(line.strip()) - set("=-*# ")]
    for pattern in _WHY:
        hits = [line for line in lines if re.search(pattern, line) and "ChildFailedError" not in line]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else "(no output)"


def _write_log(path: Path, step: Step, code: int | str, out: str | None, err: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"$ {step.shell()}\nexit: {code}\n\n--- stdout\n{out or ''}\n--- stderr\n{err or ''}\n")


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a new process group: a timeout ends the launcher's ranks and pytest's runs too."""
    import signal

    with subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()  # what it printed before the kill goes to the log
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_check(check: Check, ctx: Context, deadline: float) -> CheckResult:
    """Run the steps in order (each may use the last's folder), then judge what they wrote."""
    from accel_train.launch import child_env

    result = CheckResult(check.name, FAIL, commands=[s.shell() for s in check.steps])
    if ctx.gpus is not None and ctx.gpus < check.min_gpus:
        result.status, result.detail = NOT_RUN, f"needs {check.min_gpus} GPUs; this machine has {ctx.gpus}"
        return result
    limit = min(check.timeout_s, deadline - time.monotonic())
    if limit < MIN_CHECK_S:
        result.status, result.detail = NOT_RUN, "the time budget (--budget-min) was spent before it could start"
        return result
    logs = ctx.work / check.name
    result.log_dir = str(logs)
    t0, procs = time.monotonic(), {}
    for step in check.steps:
        left = limit - (time.monotonic() - t0)
        try:
            proc = _run(step.argv, child_env(step.env), timeout=max(left, 1))
        except subprocess.TimeoutExpired as exc:
            _write_log(logs / f"{step.label}.log", step, "killed: timed out", exc.output, exc.stderr)
            result.duration_s = time.monotonic() - t0
            result.detail = f"{step.label} timed out: the check's {limit:.0f} s were spent (log: {logs})"
            return result
        _write_log(logs / f"{step.label}.log", step, proc.returncode, proc.stdout, proc.stderr)
        procs[step.label] = proc
        if step.must_succeed and proc.returncode != 0:
            result.duration_s = time.monotonic() - t0
            why = _why(f"{proc.stderr}\n{proc.stdout}")
            result.detail = f"{step.label} exited {proc.returncode}: {why}"
            return result
    try:
        ok, detail, metrics = check.judge(ctx, procs, check)
    except Exception as exc:  # noqa: BLE001 - a judge that cannot read the runs is a failed check, not a crash
        ok, detail, metrics = False, f"could not judge the runs: {type(exc).__name__}: {exc}", {}
    result.status, result.detail, result.metrics = (PASS if ok else FAIL), detail, metrics
    result.duration_s = time.monotonic() - t0
    return result


# ---- the report -------------------------------------------------------------------------------------------------
def counts(results: list[CheckResult]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in (PASS, FAIL, NOT_RUN)}


def exit_code(results: list[CheckResult]) -> int:
    """1 when any check failed; a check that did not run is not a failure (and never a pass)."""
    return 1 if any(r.status == FAIL for r in results) else 0


def _counts_line(results: list[CheckResult]) -> str:
    c = counts(results)
    return f"{c[PASS]} passed, {c[FAIL]} failed, {c[NOT_RUN]} not run"


def _cell(text: str) -> str:
    """Text for one markdown table cell: a ``|`` would end the cell."""
    return text.replace("|", "\\|")


def _markdown(results: list[CheckResult], info: dict[str, Any]) -> str:
    lines = [
        "# GPU acceptance report",
        "",
        f"Written by `python scripts/gpu_acceptance.py` on {info.get('date', '?')}: **{_counts_line(results)}**. "
        'A check that could not run is "not run", never "pass".',
        "",
        "| | |",
        "|---|---|",
    ]
    for key in ("device", "gpus", "driver", "torch", "cuda", "cudnn", "accelerate", "python", "git_commit", "host"):
        if key in info:
            lines.append(f"| {key.replace('_', ' ')} | {info[key]} |")
    lines += ["", "| check | status | duration | result |", "|---|---|---:|---|"]
    for r in results:
        duration = f"{r.duration_s:.0f} s" if r.duration_s is not None else "-"
        lines.append(f"| {r.name} | {r.status} | {duration} | {_cell(r.detail)} |")
    throughput = next((r for r in results if r.name == "throughput" and r.metrics.get("runs")), None)
    if throughput:
        lines += _throughput_markdown(throughput.metrics)
    lines += ["", "Commands, per check:", ""]
    for r in results:
        lines += [f"* {r.name}" + (f" (logs: `{r.log_dir}`)" if r.log_dir else "")]
        lines += [f"  * `{c}`" for c in r.commands]
    return "\n".join(lines) + "\n"


def _throughput_markdown(m: dict[str, Any]) -> list[str]:
    peak = m.get("peak_bf16_tflops")
    lines = [
        "",
        f"## Throughput: resnet18, CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}",
        "",
        f"MFU = training FLOPs per sample ({m.get('train_flops_per_sample', 0) / 1e9:.3f} GFLOP, forward x3, "
        f"FlopCounterMode) x samples/s / this GPU's measured bf16 GEMM peak ({peak} TFLOP/s), for every precision.",
        "",
        "| precision | samples/s | MFU | TFLOP/s | peak memory MB | data wait | fp16 skipped steps | loss scale |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for precision, run in m["runs"].items():
        cells = [f"{run['samples_per_s']:,.0f}", f"{run['mfu']:.1%}", run.get("achieved_tflops")]
        wait = run.get("data_wait_fraction")
        cells += [run.get("peak_memory_mb"), None if wait is None else f"{wait:.1%}"]
        cells += [run.get("fp16_skipped_steps"), run.get("loss_scale")]
        lines.append(f"| {precision} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return lines


def write_report(results: list[CheckResult], info: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``out/acceptance.json`` (everything) and ``out/acceptance.md`` (the tables people read)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"environment": info, "counts": counts(results), "checks": [asdict(r) for r in results]}
    json_path, md_path = out / "acceptance.json", out / "acceptance.md"
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md_path.write_text(_markdown(results, info))
    return json_path, md_path


# ---- the machine --------------------------------------------------------------------------------------------------
def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git here; pass --commit)"
    if head.returncode != 0:
        return "unknown (not a git checkout; pass --commit)"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def _driver() -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None


def environment_info(gpus: int, commit: str | None) -> dict[str, Any]:
    import platform

    import accelerate
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": ", ".join(sorted(set(names))),
        "gpus": gpus,
        "driver": _driver(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "accelerate": accelerate.__version__,
        "python": platform.python_version(),
        "git_commit": commit or _git_commit(),
        "host": platform.node(),
    }


def _reexec(argv: list[str]) -> None:
    """Start this script again, once: a fresh interpreter sees what pip installed; PYTHONPATH finds accel_train."""
    if os.environ.get(_REEXEC) == "1":
        raise SetupError(f"accel_train cannot be imported even with PYTHONPATH={REPO}; is this the repository?")
    env = {**os.environ, _REEXEC: "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def ensure_accel_train(argv: list[str]) -> None:
    if importlib.util.find_spec("accel_train") is None:
        _reexec(argv)


def install_wheels(wheels: Path) -> None:
    """``pip install --no-index --find-links DIR -r requirements.txt``, then accel_train itself (editable)."""
    if not wheels.is_dir():
        raise SetupError(f"--wheels {wheels}: no such folder; give the folder that holds the .whl files")
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels.resolve())]
    cmd = [*pip, "-r", str(REPO / "requirements.txt")]
    print(f"$ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        raise SetupError(
            f"installing requirements.txt from {wheels} failed (pip's message is above): the folder needs a wheel "
            f"for every missing package and its dependencies, for Python {sys.version_info.major}."
            f"{sys.version_info.minor} on this platform; docs/gpu/README.md shows how to make them"
        )
    cmd = [*pip, "--no-deps", "--no-build-isolation", "-e", str(REPO)]
    print(f"$ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        print("warning: accel_train itself did not install (editable); going on with PYTHONPATH", file=sys.stderr)


def prepare_packages(args: argparse.Namespace, argv: list[str]) -> None:
    """Install from ``--wheels`` (then start again), or check that every package imports."""
    if args.wheels and os.environ.get(_REEXEC) != "1":
        install_wheels(Path(args.wheels))
        _reexec(argv)
    missing = [pip for module, pip in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise SetupError(
            f"missing Python packages: {', '.join(missing)}. Install them with `python -m pip install -r "
            "requirements.txt pytest`, or, without a package index, from wheels made elsewhere: "
            "`python scripts/gpu_acceptance.py --wheels DIR` (docs/gpu/README.md)"
        )
    ensure_accel_train(argv)


def cuda_gpus() -> int:
    import torch

    if not torch.cuda.is_available():
        raise SetupError(
            "no CUDA GPU visible (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): run this on a GPU machine; --plan lists the checks "
            "without one"
        )
    return torch.cuda.device_count()


def _gpus_if_known() -> int | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---- the command ------------------------------------------------------------------------------------------------
def print_plan(checks: list[Check], ctx: Context) -> None:
    gpus = "unknown (torch is not installed)" if ctx.gpus is None else str(ctx.gpus)
    print("GPU acceptance plan (--plan runs nothing). Without --plan, each check below runs in this order.")
    print(f"CUDA GPUs visible here: {gpus}. Time budget: {ctx.budget_s / 60:.0f} min. Runs and logs: {ctx.work}")
    print(f"Report: {ctx.out / 'acceptance.json'} and {ctx.out / 'acceptance.md'}")
    for check in checks:
        print(f"\n({chr(ord('a') + CHECK_NAMES.index(check.name))}) {check.name}: {check.title}")
        print(f"    needs {check.min_gpus} GPU(s); timeout {check.timeout_s} s")
        print(f"    passes when: {check.passes_when}")
        if ctx.gpus is not None and ctx.gpus < check.min_gpus:
            print(f"    here: not run (this machine has {ctx.gpus} GPU(s))")
        if check.in_process:
            print(f"    in this process: {check.in_process}")
        for step in check.steps:
            print(f"    $ {step.shell()}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run accel_train's GPU checks on this machine and write docs/gpu/acceptance.{json,md}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--plan", action="store_true", help="print the checks and their commands, run nothing")
    parser.add_argument("--wheels", metavar="DIR", help="first pip-install requirements.txt from wheels in DIR")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for acceptance.json and acceptance.md")
    parser.add_argument("--work", default=str(DEFAULT_WORK), help="runs and logs go to WORK/<time>/")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(CHECK_NAMES)}")
    parser.add_argument("--budget-min", type=float, default=25.0, help="stop starting checks after this long")
    parser.add_argument("--commit", help="the git commit to report when this tree has no .git")
    return parser.parse_args(argv)


def _only(only: str | None) -> list[str]:
    """The checks to run, in CHECK_NAMES order (all of them without --only)."""
    names = [n.strip() for n in (only or "").split(",") if n.strip()] or list(CHECK_NAMES)
    unknown = sorted(set(names) - set(CHECK_NAMES))
    if unknown:
        raise SetupError(f"--only: unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECK_NAMES)}")
    return [n for n in CHECK_NAMES if n in names]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        names = _only(args.only)
        if args.plan:
            ensure_accel_train(argv)
            gpus = _gpus_if_known()
        else:
            prepare_packages(args, argv)
            gpus = cuda_gpus()
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        ctx = Context(Path(args.work).resolve() / stamp, Path(args.out).resolve(), gpus, args.budget_min * 60)
        checks = [c for c in build_checks(ctx) if c.name in names]
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if args.plan:
        print_plan(checks, ctx)
        return 0
    info = environment_info(gpus, args.commit)
    print(f"{info['device']} x {gpus}, torch {info['torch']} (CUDA {info['cuda']}), accelerate {info['accelerate']}")
    deadline = time.monotonic() + ctx.budget_s
    results = []
    for check in checks:
        print(f"[{check.name}] {check.title} ...", flush=True)
        results.append(run_check(check, ctx, deadline))
        r = results[-1]
        took = f" ({r.duration_s:.0f} s)" if r.duration_s is not None else ""
        print(f"[{check.name}] {r.status}{took}: {r.detail}", flush=True)
    json_path, md_path = write_report(results, info, ctx.out)
    print(f"wrote {json_path} and {md_path}")
    print(_counts_line(results))
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
