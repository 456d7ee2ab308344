"""The GPU acceptance's checks, in plan order (``CHECK_NAMES``, each with its timeout): for each, the children
it runs (``scripts/train.py`` on GPU 0 or launched, or a ``gpu_probe``), what it must show to pass, and the
``measure``/``judge`` pair that decides it; and the tiny stand-in checks the unit tests run (``--fake-checks``)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from benchmarks.gpu_acceptance import speed as J
from benchmarks.gpu_acceptance import parallel as JP
from benchmarks.gpu_acceptance import resume as JS
from benchmarks.gpu_acceptance.runner import PASS, REPO, Check, Context, Step

FAST = ["--report-to", "none", "--no-plots", "--no-progress"]
# For comparisons: no TF32 (fp32 stays fp32), cuBLAS kernels that give the same result every time.
DETERMINISTIC = {"NVIDIA_TF32_OVERRIDE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
GPU0 = {"CUDA_VISIBLE_DEVICES": "0"}  # a plain train.py on several visible GPUs would be DataParallel
CIFAR_SHAPED = ["--dataset", "synthetic", "--synthetic-channels", "3", "--synthetic-image-size", "32"]
SMALL_CIFAR = [*CIFAR_SHAPED, "--synthetic-size", "512", "--synthetic-test-size", "128"]
SGD = ["--optimizer", "sgd", "--lr", "0.05"]

# (name, timeout_s) in plan order (gpu_plan.COMMANDS, then gpu_plan.LATER): the first command's checks, the verdicts
# that decide whether a GPU user can trust the project; the second command's, by value; then those beyond today's
# device time. Each timeout is at least 1.3x the check's expected seconds on an H100 (gpu_sizing.expected_s, from
# start-up costs measured on the CPU and the FLOPs), more where the estimate is least certain.
TIMEOUTS = {
    # the first command: does a GPU user get what the CPU promised?
    "setup": 30,
    "bf16-resume": 45,
    "ddp": 45,
    "throughput-bf16": 55,
    "compile": 150,  # the least certain estimate: Triton's compile on a fresh machine
    # the second command, when the session's time allows
    "pytest": 105,
    "fsdp": 75,
    "device-batch": 35,
    "sync-bn": 60,
    # beyond today's device time: a later machine's command
    "throughput": 160,
    "resume": 35,
    "speedrun": 60,
    "dp": 15,
    # two GPUs
    "dp_ddp": 75,
}
CHECK_NAMES = tuple(TIMEOUTS)


def _train(
    label: str, ctx: Context, check: str, *args: str, run: str | None = None, config: str | None = None,
    launch_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
) -> Step:  # fmt: skip
    """``scripts/train.py`` writing to ``work/<check>/<run or label>``: plainly on GPU 0, or launched."""
    from accel_train.doctor.launching import script_cmd

    out = ctx.work / check / (run or label)
    argv = script_cmd("train.py", *args, *FAST, "--output-dir", str(out), config=config, launch_args=launch_args)
    return Step(label, argv, {**(GPU0 if config is None else {}), **(env or {})}, out)


def _probe(label: str, ctx: Context, check: str, probe: str, *args: str, env: dict[str, str] | None = None) -> Step:
    """``python -m benchmarks.gpu_acceptance.probe PROBE ARGS --out work/<check>/<label>.json`` (``--out`` last)."""
    out = ctx.work / check / f"{label}.json"
    return Step(
        label, [sys.executable, "-m", "benchmarks.gpu_acceptance.probe", probe, *args, "--out", str(out)], {**GPU0, **(env or {})}
    )


def setup_check(ctx: Context) -> Check:
    return Check(
        "setup", "import times, the carried wheels (datasets, evaluate) and CUDA, in a fresh process",
        "datasets, evaluate, accel_train and its accuracy metric import and compute, and torch sees a GPU "
        "(the seconds each import takes are reported: every training process pays them)",
        TIMEOUTS["setup"], [_probe("imports", ctx, "setup", "imports")], J.measure_setup, J.judge_setup,
        exercises="the environment every other check relies on",
    )  # fmt: skip


def gpu_test_files() -> list[str]:
    """The test modules with GPU-marked tests: only they are collected (a module that cannot even be imported
    on the GPU machine must not fail the GPU tests)."""
    marks = ("mark.gpu", "mark.multigpu")
    files = sorted(p for p in (REPO / "tests").glob("test_*.py") if any(m in p.read_text() for m in marks))
    return [str(p.relative_to(REPO)) for p in files]


def pytest_check(ctx: Context) -> Check:
    argv = [sys.executable, "-m", "pytest", "-m", "gpu or multigpu", "-v", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("xdist"):  # the GPU machine has 16 cores; runs that share a fixture stay together
        argv += ["-n", "4", "--dist", "loadgroup"]
    if importlib.util.find_spec("pytest_timeout"):
        argv += ["--timeout", "240"]
    argv += gpu_test_files()
    return Check(
        "pytest", "the GPU-marked tests (tests/integration/test_gpu.py)",
        "pytest exits 0, at least one test passed and none failed or errored (multigpu tests skip on one GPU)",
        TIMEOUTS["pytest"], [Step("pytest", argv, must_succeed=False)], J.measure_pytest, J.judge_pytest,
        exercises="single-GPU training, bf16/fp16, CPU<->GPU resume, FSDP bf16, data and augmentation on the GPU",
    )  # fmt: skip


THROUGHPUT_BATCH, THROUGHPUT_STEPS = 512, 200
THROUGHPUT_ROWS = {
    "fp32": ["--mixed-precision", "no", "--no-tf32"],
    "tf32": ["--mixed-precision", "no"],
    "bf16": ["--mixed-precision", "bf16"],
    "fp16": ["--mixed-precision", "fp16"],
}


def _throughput_steps(ctx: Context, check: str, rows: tuple[str, ...]) -> list[Step]:
    """The bf16 GEMM peak probe, then one resnet18 run per row (the same data, batch and steps in every row)."""
    data = [*CIFAR_SHAPED, "--synthetic-size", str(THROUGHPUT_BATCH * 100), "--synthetic-test-size", "2560"]
    args = ["--model", "resnet18", *data, "--batch-size", str(THROUGHPUT_BATCH), "--max-steps", str(THROUGHPUT_STEPS)]
    args += ["--log-every", "25", "--no-checkpoint-epochs"]  # a log syncs the GPU: the host clock stays honest
    steps = [_probe("gemm", ctx, check, "gemm", "--model", "resnet18")]
    return steps + [_train(row, ctx, check, *args, *THROUGHPUT_ROWS[row]) for row in rows]


def throughput_bf16_check(ctx: Context) -> Check:
    return Check(
        "throughput-bf16",
        f"resnet18 in bf16 (channels_last, the CUDA default), CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}, "
        f"{THROUGHPUT_STEPS} steps (the first {J.TIMED_AFTER_STEPS} untimed); the bf16 GEMM peak measured beside it",
        "the row finishes on the GPU in bf16 with a finite loss and a samples/s, and the GEMM peak is measured "
        "(samples/s, MFU against that peak, achieved TFLOP/s and memory are reported, not judged)",
        TIMEOUTS["throughput-bf16"], _throughput_steps(ctx, "throughput-bf16", ("bf16",)), J.measure_throughput,
        J.judge_throughput_bf16, exercises="one GPU's speed in the precision a GPU user trains in",
        expected_steps=THROUGHPUT_STEPS,
    )  # fmt: skip


def throughput_check(ctx: Context) -> Check:
    return Check(
        "throughput",
        f"resnet18, CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}, {THROUGHPUT_STEPS} steps: fp32 (TF32 "
        "off), tf32, bf16 and fp16 as separate rows",
        "every row finishes on the GPU with a finite loss in its own precision (fp32 with TF32 off, tf32 on), "
        f"and fp16 shows a real loss scale (a power of two) with at most {J.FP16_MAX_SKIPPED:.0%} of steps skipped "
        "(samples/s, MFU against the measured bf16 GEMM peak, memory and speed-ups are reported, not judged)",
        TIMEOUTS["throughput"], _throughput_steps(ctx, "throughput", tuple(THROUGHPUT_ROWS)), J.measure_throughput,
        J.judge_throughput, exercises="one GPU's speed in each precision", expected_steps=THROUGHPUT_STEPS,
    )  # fmt: skip


def speedrun_check(ctx: Context) -> Check:
    work = ctx.work / "speedrun"
    step = _probe("speedrun", ctx, "speedrun", "speedrun", "--work", str(work), "--warmup-steps", "60")
    return Check(
        "speedrun",
        f"airbench's recipe at full length ({J.SPEEDRUN_STEPS} steps of 1024, bf16) on random CIFAR-10-format "
        "files (50k/10k), after a 60-step warm-up in the same process",
        "the run holds its data on the GPU and augments it there (crop + flip), reaches "
        f"{J.SPEEDRUN_STEPS} steps with a finite loss; train_time_s (after the warm-up: no cuDNN autotuning) is "
        f"reported beside airbench's published {J.SPEEDRUN_PUBLISHED_S} A100-seconds (accuracy on random data "
        "means nothing: python -m benchmarks.speed.speedrun --data-dir DIR with CIFAR-10)",
        TIMEOUTS["speedrun"], [step], J.measure_speedrun, J.judge_speedrun,
        exercises="the recipe's batched augmentation on the GPU, timed", expected_steps=J.SPEEDRUN_STEPS,
    )  # fmt: skip


RESUME_STEPS, RESUME_STOP = 40, 17  # 2048 samples of 64: the epoch ends at step 32, between the stop and the end


def _stop_resume_steps(ctx: Context, check: str, args: list[str]) -> list[Step]:
    """Straight to the end; stopped at RESUME_STOP and resumed in one folder. Each records its inputs' checksums
    (``$GPU_PROBE_RECORD``, read by the data-order comparison); deterministic cuBLAS, TF32 off."""

    def env(label: str) -> dict[str, str]:
        return {**DETERMINISTIC, "GPU_PROBE_RECORD": str(ctx.work / check / f"{label}.jsonl")}

    stop = ("--stop-at-step", str(RESUME_STOP))
    return [
        _train("straight", ctx, check, *args, env=env("straight")),
        _train("stopped", ctx, check, *args, *stop, run="resumed", env=env("stopped")),
        _train("resumed", ctx, check, *args, "--resume", "auto", env=env("resumed")),
    ]


BN_DROPOUT_NET = "benchmarks.gpu_acceptance.models:bn_dropout_net"  # BatchNorm and F.dropout: the CUDA RNG in a CNN


def bf16_resume_check(ctx: Context) -> Check:
    args = ["--model", BN_DROPOUT_NET, *CIFAR_SHAPED, "--synthetic-size", "2048", "--synthetic-test-size", "256"]
    args += [*SGD, "--mixed-precision", "bf16", "--batch-size", "64", "--max-steps", str(RESUME_STEPS)]
    args += ["--log-every", "5"]  # no --channels-last: the default a CNN gets under bf16 on CUDA is what is checked
    return Check(
        "bf16-resume",
        f"one GPU trains a BatchNorm CNN with F.dropout in bf16 (channels_last by default), checkpoints at step "
        f"{RESUME_STOP} and resumes to {RESUME_STEPS} (across an epoch end), vs straight to {RESUME_STEPS}; SGD",
        f"both runs are bf16 in channels_last on the GPU; weights and optimizer state within {JS.BF16_RESUME_TOL:g} "
        "of the straight run's (the same kernels in both: bitwise expected), the same batches in the same order, "
        "the CUDA RNG advanced by dropout and equal at the end, no RNG-restore error",
        TIMEOUTS["bf16-resume"], _stop_resume_steps(ctx, "bf16-resume", args), JS.measure_bf16_resume,
        JS.judge_bf16_resume, exercises="training, a checkpoint and its resume on one GPU in the CUDA default for CNNs "
        "(bf16 autocast, channels_last weights through safetensors, the CUDA RNG)",
        expected_steps=RESUME_STEPS, stop_at=RESUME_STOP, model=BN_DROPOUT_NET,
    )  # fmt: skip


def resume_check(ctx: Context) -> Check:
    args = ["--model", "benchmarks.gpu_acceptance.models:dropout_net", "--dataset", "synthetic", "--synthetic-size", "2048"]
    args += ["--synthetic-test-size", "256", *SGD, "--batch-size", "64", "--max-steps", str(RESUME_STEPS)]
    args += ["--log-every", "5"]
    return Check(
        "resume",
        f"a model with F.dropout in forward (the CUDA RNG) stopped at step {RESUME_STOP} and resumed to "
        f"{RESUME_STEPS} (across an epoch end), vs straight to {RESUME_STEPS}; SGD, TF32 off",
        f"weights and optimizer state within {JS.RESUME_TOL:g} of the straight run's, the same batches in the same "
        "order (input checksums), the CUDA RNG advanced by dropout and equal at the end, no RNG-restore error",
        TIMEOUTS["resume"], _stop_resume_steps(ctx, "resume", args), JS.measure_resume, JS.judge_resume,
        exercises="checkpoint/resume on the GPU in fp32 with state that really uses the CUDA RNG",
        expected_steps=RESUME_STEPS, stop_at=RESUME_STOP,
    )  # fmt: skip


FSDP_STEPS, FSDP_STOP = 12, 5


BN_NET = "benchmarks.gpu_acceptance.models:bn_net"  # BatchNorm, deterministic cuDNN: runs compare at round-off


def fsdp_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--mixed-precision", "no", "--batch-size", "32"]
    args += ["--max-steps", str(FSDP_STEPS), "--log-every", "1"]
    kw: dict[str, Any] = {"config": "fsdp.yaml", "launch_args": ("--num_processes", "1"), "env": DETERMINISTIC}
    steps = [
        _train("straight", ctx, "fsdp", *args, **kw),
        _train("stopped", ctx, "fsdp", *args, "--stop-at-step", str(FSDP_STOP), run="resumed", **kw),
        _train("resumed", ctx, "fsdp", *args, "--resume", "auto", **kw),
    ]
    return Check(
        "fsdp",
        f"fsdp.yaml at world size 1 on a small BatchNorm CNN, fp32 SGD: sharded checkpoint at step {FSDP_STOP}, "
        f"resume to {FSDP_STEPS}, vs a straight FSDP run",
        f"the resumed run within {JS.FSDP_TOL:g} of the straight one, model/model.safetensors equal to the "
        "sharded checkpoint's tensors (merged on the CPU) and to the model's own keys, shapes and dtypes",
        TIMEOUTS["fsdp"], steps, JS.measure_fsdp, JS.judge_fsdp,
        exercises="FSDP2 save/resume/export at world size 1 (a shard is the whole tensor: no sharding across ranks)",
        expected_steps=FSDP_STEPS, stop_at=FSDP_STOP, model=BN_NET,
    )  # fmt: skip


COMPILE_STEPS, COMPILE_STOP = 20, 8


def compile_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, "--dataset", "synthetic", "--synthetic-size", "1024", "--synthetic-test-size", "128"]
    args += [*SGD, "--batch-size", "64", "--max-steps", str(COMPILE_STEPS), "--log-every", "4"]
    env = {**DETERMINISTIC, "TORCHINDUCTOR_CACHE_DIR": str(ctx.work / "compile" / "inductor")}
    stop = ("--stop-at-step", str(COMPILE_STOP))
    steps = [
        _train("eager", ctx, "compile", *args, env=DETERMINISTIC),
        _train("straight", ctx, "compile", *args, "--compile", env=env),
        _train("stopped", ctx, "compile", *args, "--compile", *stop, run="resumed", env=env),
        _train("resumed", ctx, "compile", *args, "--compile", "--resume", "auto", env=env),
    ]
    return Check(
        "compile",
        f"--compile on CUDA (inductor): straight to {COMPILE_STEPS}, and stopped at {COMPILE_STOP} then resumed "
        "across an epoch end; an eager straight run beside them",
        f"inductor wrote kernels, the compiled stop+resume is within {JS.COMPILE_TOL:g} of the compiled straight "
        f"run and within {JS.COMPILE_VS_EAGER_TOL:g} of the eager one (fusion changes round-off, not training), "
        "and its export has no _orig_mod. prefix",
        TIMEOUTS["compile"], steps, JS.measure_compile, JS.judge_compile,
        exercises="torch.compile on CUDA through accelerate, with a checkpoint in between",
        expected_steps=COMPILE_STEPS, stop_at=COMPILE_STOP,
    )  # fmt: skip


SGD_LENET = ["--model", "lenet", *SGD, "--global-batch-size", "32", "--max-steps", "20", "--log-every", "1"]


def ddp_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--global-batch-size", "32", "--max-steps", "20", "--log-every", "1"]
    steps = [
        _train("plain", ctx, "ddp", *args, env=DETERMINISTIC),
        _train("ddp", ctx, "ddp", *args, config="multi_gpu.yaml", launch_args=("--num_processes", "1"),
               env={**DETERMINISTIC, "NCCL_DEBUG": "INFO"}),
    ]  # fmt: skip
    return Check(
        "ddp", "multi_gpu.yaml with one process (DDP over NCCL at world size 1) vs one plain process, a BatchNorm "
        "CNN, 20 steps",
        f"the DDP run is MULTI_GPU at world size 1, NCCL initialised, weights within {JP.DDP_TOL:g} of the plain run",
        TIMEOUTS["ddp"], steps, JP.measure_ddp, JP.judge_ddp,
        exercises="the DDP wrapper, NCCL set-up and accelerate's MULTI_GPU path (one rank: no real all-reduce)",
        expected_steps=20,
    )  # fmt: skip


SYNC_BN_STEPS = 6  # round-off between the layouts grows with every step; 6 keep it far below the control's gap
SHARED_GPU_REFUSALS = (r"(RuntimeError|NotImplementedError|ValueError).*(not supported|does not support|unsupported"
                       r"|Duplicate GPU)",)  # fmt: skip


def sync_bn_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--global-batch-size", "32", "--max-steps", str(SYNC_BN_STEPS)]
    args += ["--log-every", "1", "--threads", "4"]

    def ranks(label: str, *extra: str) -> Step:
        out = ctx.work / "sync-bn" / label
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        argv = [
            *torchrun,
            "-m",
            "benchmarks.gpu_acceptance.probe",
            "shared-gpu-rank",
            *args,
            *extra,
            *FAST,
            "--output-dir",
            str(out),
        ]
        return Step(label, argv, {**GPU0, **DETERMINISTIC}, out, refusals=SHARED_GPU_REFUSALS)

    steps = [_train("one", ctx, "sync-bn", *args, env=DETERMINISTIC), ranks("synced", "--sync-bn"), ranks("unsynced")]
    return Check(
        "sync-bn",
        "two ranks on GPU 0 (gloo with CUDA tensors) with --sync-bn vs one process at the same global batch "
        f"(32 = 2 x 16), a BatchNorm CNN, {SYNC_BN_STEPS} SGD steps; the same two ranks without --sync-bn are the "
        "control",
        f"synced ranks within {JP.SYNC_BN_TOL:g} of one process, and the control at least {JP.SYNC_BN_RATIO}x "
        f"farther and {JP.SYNC_BN_TOL:g} away (else the comparison proves nothing); 'not run' with torch's line if "
        "it refuses two ranks on one GPU",
        TIMEOUTS["sync-bn"], steps, JP.measure_sync_bn, JP.judge_sync_bn,
        exercises="CUDA SyncBatchNorm inside DDP across two processes (both on GPU 0, over gloo, not NCCL)",
        expected_steps=SYNC_BN_STEPS,
    )  # fmt: skip


def dp_check(ctx: Context) -> Check:
    return Check(
        "dp", "accel_train's AutocastDataParallel with device_ids=[0, 0]: two replicas, both on GPU 0",
        f"two replica threads run on cuda:0 in bf16 under bf16 autocast, and an fp32 step's gradients are within "
        f"{JP.DP_TOL:g} of one module's; 'not run' with torch's reason if it refuses the duplicate device",
        TIMEOUTS["dp"], [_probe("probe", ctx, "dp", "data-parallel", env=DETERMINISTIC)],
        JP.measure_data_parallel, JP.judge_data_parallel,
        exercises="the DataParallel wrapper's replica threads on CUDA (not a split across GPUs)",
    )  # fmt: skip


DEVICE_BATCH_GLOBAL = 32768


def device_batch_check(ctx: Context) -> Check:
    data = [*CIFAR_SHAPED, "--synthetic-size", str(2 * DEVICE_BATCH_GLOBAL), "--synthetic-test-size", "1024"]
    args = ["--model", "resnet18", *data, "--global-batch-size", str(DEVICE_BATCH_GLOBAL), "--max-device-batch"]
    args += ["auto", "--mixed-precision", "bf16", "--max-steps", "2", "--log-every", "1", "--no-checkpoint-epochs"]
    return Check(
        "device-batch",
        f"--max-device-batch auto for a global batch of {DEVICE_BATCH_GLOBAL} (resnet18, bf16) with the data "
        "on the GPU",
        "the probe picks a micro-batch, the run uses it with micro x accumulation = the global batch, and the "
        "dataset is still placed on the GPU after the probe",
        TIMEOUTS["device-batch"], [_train("auto", ctx, "device-batch", *args)],
        JP.measure_device_batch, JP.judge_device_batch,
        exercises="the out-of-memory probe on a real GPU, then data placement", expected_steps=2,
        global_batch=DEVICE_BATCH_GLOBAL,
    )  # fmt: skip


def dp_ddp_check(ctx: Context) -> Check:
    gpus01 = ("--gpu_ids", "0,1")
    steps = [
        _train("dp", ctx, "dp_ddp", *SGD_LENET, config="dp.yaml", launch_args=gpus01, env=DETERMINISTIC),
        _train("ddp", ctx, "dp_ddp", *SGD_LENET, config="multi_gpu.yaml",
               launch_args=("--num_processes", "2", *gpus01), env=DETERMINISTIC),
    ]  # fmt: skip
    return Check(
        "dp_ddp", "DataParallel (1 process, GPUs 0,1) vs DDP (2 processes), lenet, global batch 32, 20 steps",
        f"both exit 0 and their weights are within {JP.DDP_TOL:g}", TIMEOUTS["dp_ddp"], steps,
        JP.measure_dp_ddp, JP.judge_dp_ddp, min_gpus=2, exercises="two GPUs: not in the one-GPU plan",
    )  # fmt: skip


BUILDERS = {
    "setup": setup_check, "bf16-resume": bf16_resume_check, "ddp": ddp_check,
    "throughput-bf16": throughput_bf16_check, "compile": compile_check, "pytest": pytest_check, "fsdp": fsdp_check,
    "device-batch": device_batch_check, "sync-bn": sync_bn_check, "throughput": throughput_check,
    "resume": resume_check, "speedrun": speedrun_check, "dp": dp_check, "dp_ddp": dp_ddp_check,
}  # fmt: skip


def build_checks(ctx: Context, names: list[str] | tuple[str, ...] = CHECK_NAMES) -> list[Check]:
    assert tuple(BUILDERS) == CHECK_NAMES
    return [BUILDERS[n](ctx) for n in names]


def fake_checks(ctx: Context) -> list[Check]:
    """Tiny checks for the unit tests (``--fake-checks``): one passes, one sleeps until killed, one never starts."""

    def step(label: str, code: str) -> Step:
        return Step(label, [sys.executable, "-c", code])

    def judge(m: dict[str, Any]) -> tuple[str, str]:
        return PASS, "fine"

    sleeper = "import os, time; print('b', 'started', os.getpid(), flush=True); time.sleep(120)"
    spec = [("fake-a", "print('a done')", 30), ("fake-b", sleeper, 150), ("fake-c", "print('c done')", 30)]
    return [Check(n, n, "exits 0", t, [step(n, code)], lambda ctx, o, c: {}, judge, min_s=1) for n, code, t in spec]
