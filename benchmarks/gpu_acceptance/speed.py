"""The GPU checks of speed and memory, each what it runs, what it must show and how that is judged:
``throughput-bf16`` and ``throughput`` (resnet18 rows in each precision, MFU against the measured bf16 GEMM peak),
``speedrun`` (airbench's recipe with its augmentation on the GPU, timed after a warm-up) and ``device-batch``
(``--max-device-batch auto``'s out-of-memory probe, then the data on the GPU). Speeds and memory are reported, not
judged: a judge asks that each run ran where, how long and in the precision it should."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import FAIL, PASS, Check, Context, Step
from benchmarks.gpu_acceptance.runs import (
    CIFAR_SHAPED,
    finite,
    fmt,
    probe_step,
    run_facts,
    run_problems,
    summary,
    train_step,
    verdict,
)

# ---- throughput: fp32 (TF32 off), tf32, bf16, fp16 as separate rows (throughput-bf16: the bf16 row alone) ---------
THROUGHPUT_BATCH, THROUGHPUT_STEPS = 512, 200
THROUGHPUT_ROWS = {
    "fp32": ["--mixed-precision", "no", "--no-tf32"],
    "tf32": ["--mixed-precision", "no"],
    "bf16": ["--mixed-precision", "bf16"],
    "fp16": ["--mixed-precision", "fp16"],
}
FP16_MAX_SKIPPED = 0.1  # more overflowed steps than this share means the loss scale never settled
TIMED_AFTER_STEPS = 5  # accel_train.trainer.WARMUP_STEPS_EXCLUDED: samples/s leaves out the first steps


def _throughput_steps(ctx: Context, check: str, rows: tuple[str, ...]) -> list[Step]:
    """The bf16 GEMM peak probe, then one resnet18 run per row (the same data, batch and steps in every row)."""
    data = [*CIFAR_SHAPED, "--synthetic-size", str(THROUGHPUT_BATCH * 100), "--synthetic-test-size", "2560"]
    args = ["--model", "resnet18", *data, "--batch-size", str(THROUGHPUT_BATCH), "--max-steps", str(THROUGHPUT_STEPS)]
    args += ["--log-every", "25", "--no-checkpoint-epochs"]  # a log syncs the GPU: the host clock stays honest
    steps = [probe_step("gemm", ctx, check, "gemm", "--model", "resnet18")]
    return steps + [train_step(row, ctx, check, *args, *THROUGHPUT_ROWS[row]) for row in rows]


def throughput_bf16_check(ctx: Context) -> Check:
    return Check(
        "throughput-bf16",
        f"resnet18 in bf16 (channels_last, the CUDA default), CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}, "
        f"{THROUGHPUT_STEPS} steps (the first {TIMED_AFTER_STEPS} untimed); the bf16 GEMM peak measured beside it",
        "the row finishes on the GPU in bf16 with a finite loss and a samples/s, and the GEMM peak is measured "
        "(samples/s, MFU against that peak, achieved TFLOP/s and memory are reported, not judged)",
        55, _throughput_steps(ctx, "throughput-bf16", ("bf16",)), measure_throughput,
        judge_throughput_bf16, exercises="one GPU's speed in the precision a GPU user trains in",
        expected_steps=THROUGHPUT_STEPS,
    )  # fmt: skip


def throughput_check(ctx: Context) -> Check:
    return Check(
        "throughput",
        f"resnet18, CIFAR-shaped synthetic data, batch {THROUGHPUT_BATCH}, {THROUGHPUT_STEPS} steps: fp32 (TF32 "
        "off), tf32, bf16 and fp16 as separate rows",
        "every row finishes on the GPU with a finite loss in its own precision (fp32 with TF32 off, tf32 on), "
        f"and fp16 shows a real loss scale (a power of two) with at most {FP16_MAX_SKIPPED:.0%} of steps skipped "
        "(samples/s, MFU against the measured bf16 GEMM peak, memory and speed-ups are reported, not judged)",
        160, _throughput_steps(ctx, "throughput", tuple(THROUGHPUT_ROWS)), measure_throughput,
        judge_throughput, exercises="one GPU's speed in each precision", expected_steps=THROUGHPUT_STEPS,
    )  # fmt: skip


def measure_throughput(ctx, outputs, check) -> dict[str, Any]:
    gemm = json.loads(Path(check.step("gemm").argv[-1]).read_text())
    runs = {}
    for row in (step.label for step in check.steps if step.label in THROUGHPUT_ROWS):
        run = check.step(row).out_dir
        s = summary(run)
        runs[row] = {
            **run_facts(run),
            "samples_per_s": s.get("train_samples_per_s"),
            "peak_memory_mb": s.get("peak_memory_mb"),
            "reserved_memory_mb": s.get("peak_reserved_memory_mb"),
            "data_wait_fraction": s.get("data_wait_fraction"),
            "fp16_skipped_steps": s.get("fp16_skipped_steps"),
            "loss_scale": s.get("loss_scale"),
        }
    return throughput_metrics(gemm, runs, check.expected_steps)


def throughput_metrics(gemm: dict[str, Any], runs: dict[str, dict[str, Any]], steps: int) -> dict[str, Any]:
    """MFU and speed-ups of each row, from the GEMM probe's peak and the model's FLOPs per sample."""
    flops, peak = gemm.get("train_flops_per_sample"), gemm.get("peak_bf16_tflops")
    for run in runs.values():
        rate = run.get("samples_per_s")
        if finite(rate) and finite(flops) and finite(peak) and peak > 0:
            run["achieved_tflops"] = round(flops * rate / 1e12, 2)
            run["mfu"] = round(flops * rate / (peak * 1e12), 4)
    speedups = {}
    for base in ("fp32", "tf32"):
        base_rate = runs.get(base, {}).get("samples_per_s")
        if finite(base_rate) and base_rate > 0:
            speedups[base] = {
                row: round(r["samples_per_s"] / base_rate, 3)
                for row, r in runs.items()
                if finite(r.get("samples_per_s"))
            }
    return {
        "peak_bf16_tflops": peak,
        "train_flops_per_sample": flops,
        "expected_steps": steps,
        "runs": runs,
        "speedup_vs_fp32": speedups.get("fp32", {}),
        "speedup_vs_tf32": speedups.get("tf32", {}),
    }


def _rows_problems(m: dict[str, Any], rows: tuple[str, ...]) -> list[str]:
    runs, problems = m.get("runs", {}), []
    for row in rows:
        if row not in runs:
            problems.append(f"no {row} row")
            continue
        problems += _row_problems(row, runs[row], m.get("expected_steps"))
    if not finite(m.get("peak_bf16_tflops")):
        problems.append("no GEMM peak measured")
    return problems


def judge_throughput(m: dict[str, Any]) -> tuple[str, str]:
    problems = _rows_problems(m, THROUGHPUT_ROWS)
    if problems:
        return FAIL, "; ".join(problems)
    runs = m["runs"]
    rates = ", ".join(f"{row} {runs[row]['samples_per_s']:,.0f}" for row in THROUGHPUT_ROWS)
    best = max(THROUGHPUT_ROWS, key=lambda r: runs[r]["samples_per_s"])
    mfu = runs[best].get("mfu")
    return PASS, (
        f"samples/s: {rates}; best {best}, MFU {mfu:.1%} of the measured {m['peak_bf16_tflops']} TFLOP/s bf16 peak; "
        f"fp16 loss scale {runs['fp16']['loss_scale']:g}"
    )


def judge_throughput_bf16(m: dict[str, Any]) -> tuple[str, str]:
    """The bf16 row alone: it runs in bf16, in channels_last (the CUDA default for a CNN), to the end."""
    problems = _rows_problems(m, ("bf16",))
    row = m.get("runs", {}).get("bf16", {})
    if row and row.get("channels_last") is not True:
        problems.append(f"bf16: channels_last {row.get('channels_last')!r}, expected the CUDA default (True)")
    if problems:
        return FAIL, "; ".join(problems)
    mfu, memory = row.get("mfu"), row.get("peak_memory_mb")
    return PASS, (
        f"bf16 {row['samples_per_s']:,.0f} samples/s, MFU {'-' if mfu is None else f'{mfu:.1%}'} of the measured "
        f"{m['peak_bf16_tflops']} TFLOP/s bf16 GEMM peak ({fmt(row.get('achieved_tflops'))} TFLOP/s)"
        + ("" if memory is None else f", peak memory {memory:,.0f} MB")
    )


def _row_problems(row: str, r: dict[str, Any], steps: int | None) -> list[str]:
    problems = run_problems(row, r, steps) if steps else []
    precision = row if row in ("bf16", "fp16") else "no"
    if r.get("mixed_precision") != precision:
        problems.append(f"{row}: mixed_precision {r.get('mixed_precision')!r}, expected {precision!r}")
    if row in ("fp32", "tf32") and r.get("tf32") is not (row == "tf32"):
        problems.append(f"{row}: the run says tf32 {r.get('tf32')!r}")
    if not (finite(r.get("samples_per_s")) and r["samples_per_s"] > 0):
        problems.append(f"{row}: no samples/s")
    scale, skipped = r.get("loss_scale"), r.get("fp16_skipped_steps")
    if row != "fp16":
        if scale is not None:
            problems.append(f"{row}: a loss scale ({scale}) without fp16")
        return problems
    if not (finite(scale) and scale >= 1 and math.log2(scale).is_integer()):
        problems.append(f"fp16: loss scale {scale!r} is not a real GradScaler scale (a power of two >= 1)")
    if not isinstance(skipped, int) or isinstance(skipped, bool):
        problems.append(f"fp16: fp16_skipped_steps is {skipped!r}, not a count")
    elif steps and skipped > FP16_MAX_SKIPPED * steps:
        problems.append(f"fp16: {skipped} of {steps} steps overflowed and were skipped")
    return problems


# ---- speed run: real augmentation on the device, timed after a warm-up --------------------------------------------
SPEEDRUN_STEPS = 648  # configs/airbench_cifar10.yaml's max_steps (13.5 epochs of 48 batches of 1024)
SPEEDRUN_PUBLISHED_S = 5.5  # airbench's A100 seconds for that recipe (benchmarks/speed/speedrun.py, PUBLISHED)


def speedrun_check(ctx: Context) -> Check:
    work = ctx.work / "speedrun"
    step = probe_step("speedrun", ctx, "speedrun", "speedrun", "--work", str(work), "--warmup-steps", "60")
    return Check(
        "speedrun",
        f"airbench's recipe at full length ({SPEEDRUN_STEPS} steps of 1024, bf16) on random CIFAR-10-format "
        "files (50k/10k), after a 60-step warm-up in the same process",
        "the run holds its data on the GPU and augments it there (crop + flip), reaches "
        f"{SPEEDRUN_STEPS} steps with a finite loss; train_time_s (after the warm-up: no cuDNN autotuning) is "
        f"reported beside airbench's published {SPEEDRUN_PUBLISHED_S} A100-seconds (accuracy on random data "
        "means nothing: python -m benchmarks.speed.speedrun --data-dir DIR with CIFAR-10)",
        60, [step], measure_speedrun, judge_speedrun,
        exercises="the recipe's batched augmentation on the GPU, timed", expected_steps=SPEEDRUN_STEPS,
    )  # fmt: skip


def measure_speedrun(ctx, outputs, check) -> dict[str, Any]:
    probe = json.loads(Path(check.step("speedrun").argv[-1]).read_text())
    run = Path(probe["run_dir"])
    s = summary(run)
    return {
        **run_facts(run),
        "probe": probe,
        "train_time_s": s.get("train_time_s"),
        "setup_s": s.get("setup_s"),
        "samples_per_s": s.get("train_samples_per_s"),
        "peak_memory_mb": s.get("peak_memory_mb"),
        "airbench_published_a100_train_s": SPEEDRUN_PUBLISHED_S,
    }


def judge_speedrun(m: dict[str, Any]) -> tuple[str, str]:
    problems = run_problems("speedrun", m, SPEEDRUN_STEPS)
    if m.get("mixed_precision") != "bf16":
        problems.append(f"mixed_precision {m.get('mixed_precision')!r}, expected bf16")
    if m.get("data_on_device") is not True:
        problems.append("the dataset was not on the GPU, so its augmentation did not run there")
    if not m.get("augment"):
        problems.append("the run did not augment (resolved.augment is empty)")
    probe = m.get("probe", {})
    if not (probe.get("same_process") and (probe.get("warmup_steps") or 0) >= 10 and probe.get("cudnn_benchmark")):
        problems.append(f"no warm-up in the same process before the timed run (probe: {probe})")
    if not (finite(m.get("train_time_s")) and m["train_time_s"] > 0):
        problems.append(f"train_time_s {m.get('train_time_s')!r}")
    return verdict(problems, (
        f"{SPEEDRUN_STEPS} steps in {fmt(m.get('train_time_s'))} s of training after a "
        f"{probe.get('warmup_steps')}-step warm-up ({fmt(m.get('samples_per_s'))} samples/s, augment "
        f"{m.get('augment')}); airbench publishes {SPEEDRUN_PUBLISHED_S} s on an A100"
    ))  # fmt: skip


# ---- --max-device-batch auto with the data on the device ----------------------------------------------------------
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
        35, [train_step("auto", ctx, "device-batch", *args)],
        measure_device_batch, judge_device_batch,
        exercises="the out-of-memory probe on a real GPU, then data placement", expected_steps=2,
        global_batch=DEVICE_BATCH_GLOBAL,
    )  # fmt: skip


_AUTO = re.compile(r"--max-device-batch auto: (\d+) is the largest micro-batch")


def measure_device_batch(ctx, outputs, check) -> dict[str, Any]:
    run = check.step("auto").out_dir
    s = summary(run)
    hit = _AUTO.search(outputs["auto"].output)
    return {
        **run_facts(run),
        "expected_steps": check.expected_steps,
        "expected_global_batch": check.global_batch,
        "probed_micro_batch": int(hit.group(1)) if hit else None,
        "peak_memory_mb": s.get("peak_memory_mb"),
        "reserved_memory_mb": s.get("peak_reserved_memory_mb"),
    }


def judge_device_batch(m: dict[str, Any]) -> tuple[str, str]:
    problems = run_problems("auto", m, m.get("expected_steps"))
    micro, accum, glob = m.get("micro_batch"), m.get("accum_steps"), m.get("global_batch")
    if m.get("probed_micro_batch") is None:
        problems.append("no '--max-device-batch auto: N is the largest micro-batch' line: the probe did not run")
    elif micro != m["probed_micro_batch"]:
        problems.append(f"the run used micro-batch {micro}, the probe chose {m['probed_micro_batch']}")
    if glob != m.get("expected_global_batch") or not (micro and accum and micro * accum == glob):
        problems.append(
            f"micro {micro} x accumulation {accum} != global batch {glob} (asked {m.get('expected_global_batch')})"
        )
    if m.get("data_on_device") is not True:
        problems.append("the dataset stayed on the host after the probe (resolved.data_on_device is false)")
    return verdict(problems, (
        f"probe chose micro-batch {micro} x {accum} for global {glob}; data on the GPU; peak "
        f"{m.get('peak_memory_mb')} MB allocated, {m.get('reserved_memory_mb')} MB reserved"
    ))  # fmt: skip
