"""What each GPU acceptance check measures (``measure_*``: reads the runs) and how it is judged (``judge_*``).
This module judges the environment and the speed (``setup``, ``pytest``, ``throughput``, ``speedrun``); the
checks that stop and resume are judged in ``gpu_judges_state``, those with several replicas in
``gpu_judges_parallel``, and ``gpu_runs`` reads the runs for all of them.

A judge takes the measurements alone and returns ``(status, one-line detail)``, so a unit test without a
GPU can hand it a deliberately wrong result and see it fail (tests/unit/test_gpu_acceptance.py). Where a
comparison could pass without proving anything, the check carries its own control and the judge demands
it: the resume's RNG must have advanced (else nothing used it), the unsynchronised BatchNorm run must
differ (else --sync-bn's agreement says nothing), the compiled run must have left inductor's kernels.

Comparisons between runs use SGD with TF32 off: a weight then differs by about lr x (the gradient's
round-off) per step, while a real mistake (a wrong batch, a lost optimizer or RNG state) moves it by about
lr x the gradient itself, orders of magnitude more.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import FAIL, PASS
from benchmarks.gpu_acceptance.runs import _finite, _g, _run_facts, _run_problems, _verdict, summary

FP16_MAX_SKIPPED = 0.1  # more overflowed steps than this share means the loss scale never settled
THROUGHPUT_ROWS = ("fp32", "tf32", "bf16", "fp16")
TIMED_AFTER_STEPS = 5  # accel_train.trainer.WARMUP_STEPS_EXCLUDED: samples/s leaves out the first steps
SPEEDRUN_STEPS = 648  # configs/airbench_cifar10.yaml's max_steps (13.5 epochs of 48 batches of 1024)
SPEEDRUN_PUBLISHED_S = 5.5  # airbench's A100 seconds for that recipe (benchmarks/speed/speedrun.py, PUBLISHED)


# ---- setup: the carried wheels import, CUDA is there ------------------------------------------------------------
def measure_setup(ctx, outputs, check) -> dict[str, Any]:
    return json.loads(Path(check.step("imports").argv[-1]).read_text())


def judge_setup(m: dict[str, Any]) -> tuple[str, str]:
    problems = [f"import {k} failed: {v}" for k, v in m.get("errors", {}).items()]
    if not m.get("cuda", {}).get("available"):
        problems.append("torch sees no CUDA GPU")
    if not (_finite(m.get("metric_accuracy")) and abs(m["metric_accuracy"] - 2 / 3) < 1e-9):
        problems.append(f"the accuracy metric computed {m.get('metric_accuracy')!r} for 2 of 3 right")
    secs = m.get("seconds", {})
    times = ", ".join(f"{k} {v:.1f} s" for k, v in secs.items())
    extra = " (imports transformers)" if m.get("transformers_imported_by_evaluate") else ""
    return _verdict(problems, f"imports: {times}{extra}; {m.get('cuda', {}).get('device')}")


# ---- pytest -------------------------------------------------------------------------------------------------------
_OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def measure_pytest(ctx, outputs, check) -> dict[str, Any]:
    out = outputs["pytest"]
    return pytest_counts(out.output, out.returncode)


def pytest_counts(output: str, returncode: int | None) -> dict[str, Any]:
    """Counts from pytest's last line; from its per-test lines (``-v``) when it was killed before that line."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    final = [line for line in output.splitlines() if re.match(r"^=+ .*\bin [\d.]+s", line)]
    if final:
        for n, word in _SUMMARY.findall(final[-1]):
            key = "errors" if word.startswith("error") else word
            if key in counts:
                counts[key] = int(n)
    else:
        words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
        for line in output.splitlines():
            hit = _OUTCOME.search(line) if "::" in line else None
            if hit and hit.group(1) in words:
                counts[words[hit.group(1)]] += 1
    failed = sorted({m for m in re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)})
    return {**counts, "returncode": returncode, "finished": bool(final), "failed_tests": failed[:20]}


def judge_pytest(m: dict[str, Any]) -> tuple[str, str]:
    line = f"{m['passed']} passed, {m['failed']} failed, {m['errors']} errors, {m['skipped']} skipped"
    ok = m.get("returncode") == 0 and m["passed"] > 0 and m["failed"] == m["errors"] == 0
    if ok:
        return PASS, line
    why = f" ({', '.join(m['failed_tests'][:5])})" if m.get("failed_tests") else ""
    if m["passed"] == 0 and not m["failed"]:
        why += " (nothing passed: were the GPU tests skipped?)"
    return FAIL, f"{line}, pytest exit {m.get('returncode')}{why}"


# ---- throughput: fp32 (TF32 off), tf32, bf16, fp16 as separate rows (throughput-bf16: the bf16 row alone) ---------
def measure_throughput(ctx, outputs, check) -> dict[str, Any]:
    gemm = json.loads(Path(check.step("gemm").argv[-1]).read_text())
    runs = {}
    for row in (step.label for step in check.steps if step.label in THROUGHPUT_ROWS):
        run = check.step(row).out_dir
        s = summary(run)
        runs[row] = {
            **_run_facts(run),
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
        if _finite(rate) and _finite(flops) and _finite(peak) and peak > 0:
            run["achieved_tflops"] = round(flops * rate / 1e12, 2)
            run["mfu"] = round(flops * rate / (peak * 1e12), 4)
    speedups = {}
    for base in ("fp32", "tf32"):
        base_rate = runs.get(base, {}).get("samples_per_s")
        if _finite(base_rate) and base_rate > 0:
            speedups[base] = {
                row: round(r["samples_per_s"] / base_rate, 3)
                for row, r in runs.items()
                if _finite(r.get("samples_per_s"))
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
    if not _finite(m.get("peak_bf16_tflops")):
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
        f"{m['peak_bf16_tflops']} TFLOP/s bf16 GEMM peak ({_g(row.get('achieved_tflops'))} TFLOP/s)"
        + ("" if memory is None else f", peak memory {memory:,.0f} MB")
    )


def _row_problems(row: str, r: dict[str, Any], steps: int | None) -> list[str]:
    problems = _run_problems(row, r, steps) if steps else []
    precision = row if row in ("bf16", "fp16") else "no"
    if r.get("mixed_precision") != precision:
        problems.append(f"{row}: mixed_precision {r.get('mixed_precision')!r}, expected {precision!r}")
    if row in ("fp32", "tf32") and r.get("tf32") is not (row == "tf32"):
        problems.append(f"{row}: the run says tf32 {r.get('tf32')!r}")
    if not (_finite(r.get("samples_per_s")) and r["samples_per_s"] > 0):
        problems.append(f"{row}: no samples/s")
    scale, skipped = r.get("loss_scale"), r.get("fp16_skipped_steps")
    if row != "fp16":
        if scale is not None:
            problems.append(f"{row}: a loss scale ({scale}) without fp16")
        return problems
    if not (_finite(scale) and scale >= 1 and math.log2(scale).is_integer()):
        problems.append(f"fp16: loss scale {scale!r} is not a real GradScaler scale (a power of two >= 1)")
    if not isinstance(skipped, int) or isinstance(skipped, bool):
        problems.append(f"fp16: fp16_skipped_steps is {skipped!r}, not a count")
    elif steps and skipped > FP16_MAX_SKIPPED * steps:
        problems.append(f"fp16: {skipped} of {steps} steps overflowed and were skipped")
    return problems


# ---- speed run: real augmentation on the device, timed after a warm-up --------------------------------------------
def measure_speedrun(ctx, outputs, check) -> dict[str, Any]:
    probe = json.loads(Path(check.step("speedrun").argv[-1]).read_text())
    run = Path(probe["run_dir"])
    s = summary(run)
    return {
        **_run_facts(run),
        "probe": probe,
        "train_time_s": s.get("train_time_s"),
        "setup_s": s.get("setup_s"),
        "samples_per_s": s.get("train_samples_per_s"),
        "peak_memory_mb": s.get("peak_memory_mb"),
        "airbench_published_a100_train_s": SPEEDRUN_PUBLISHED_S,
    }


def judge_speedrun(m: dict[str, Any]) -> tuple[str, str]:
    problems = _run_problems("speedrun", m, SPEEDRUN_STEPS)
    if m.get("mixed_precision") != "bf16":
        problems.append(f"mixed_precision {m.get('mixed_precision')!r}, expected bf16")
    if m.get("data_on_device") is not True:
        problems.append("the dataset was not on the GPU, so its augmentation did not run there")
    if not m.get("augment"):
        problems.append("the run did not augment (resolved.augment is empty)")
    probe = m.get("probe", {})
    if not (probe.get("same_process") and (probe.get("warmup_steps") or 0) >= 10 and probe.get("cudnn_benchmark")):
        problems.append(f"no warm-up in the same process before the timed run (probe: {probe})")
    if not (_finite(m.get("train_time_s")) and m["train_time_s"] > 0):
        problems.append(f"train_time_s {m.get('train_time_s')!r}")
    return _verdict(problems, (
        f"{SPEEDRUN_STEPS} steps in {_g(m.get('train_time_s'))} s of training after a {probe.get('warmup_steps')}-step "
        f"warm-up ({_g(m.get('samples_per_s'))} samples/s, augment {m.get('augment')}); airbench publishes "
        f"{SPEEDRUN_PUBLISHED_S} s on an A100"
    ))  # fmt: skip
