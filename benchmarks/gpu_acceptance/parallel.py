"""The GPU checks that run more than one replica, each what it runs, what it must show and how that is judged:
``ddp`` (NCCL at world size 1 against one plain process), ``sync-bn`` (two synced ranks on GPU 0, with an unsynced
control that must differ, else the agreement proves nothing), ``dp`` (DataParallel's replica threads) and the
two-GPU ``dp_ddp``."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import NOT_RUN, Check, Context, Step
from benchmarks.gpu_acceptance.runs import (
    BN_NET,
    DETERMINISTIC,
    FAST,
    GPU0,
    SGD,
    SMALL_CIFAR,
    fmt,
    probe_step,
    run_facts,
    run_problems,
    summary,
    tensor_diff,
    train_step,
    verdict,
    weights,
)

# ---- DDP over NCCL at world size 1 --------------------------------------------------------------------------------
DDP_TOL = 1e-5  # DDP over NCCL at world size 1 vs one plain process: the same math


def ddp_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--global-batch-size", "32", "--max-steps", "20", "--log-every", "1"]
    steps = [
        train_step("plain", ctx, "ddp", *args, env=DETERMINISTIC),
        train_step("ddp", ctx, "ddp", *args, config="multi_gpu.yaml", launch_args=("--num_processes", "1"),
                   env={**DETERMINISTIC, "NCCL_DEBUG": "INFO"}),
    ]  # fmt: skip
    return Check(
        "ddp", "multi_gpu.yaml with one process (DDP over NCCL at world size 1) vs one plain process, a BatchNorm "
        "CNN, 20 steps",
        f"the DDP run is MULTI_GPU at world size 1, NCCL initialised, weights within {DDP_TOL:g} of the plain run",
        45, steps, measure_ddp, judge_ddp,
        exercises="the DDP wrapper, NCCL set-up and accelerate's MULTI_GPU path (one rank: no real all-reduce)",
        expected_steps=20,
    )  # fmt: skip


def measure_ddp(ctx, outputs, check) -> dict[str, Any]:
    plain, ddp = check.step("plain").out_dir, check.step("ddp").out_dir
    return {
        "plain": run_facts(plain),
        "ddp": run_facts(ddp),
        "expected_steps": check.expected_steps,
        "nccl_initialised": bool(re.search(r"NCCL INFO", outputs["ddp"].output)),
        "ddp_vs_plain": tensor_diff(weights(plain), weights(ddp)),
    }


def judge_ddp(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    problems += run_problems("plain", m.get("plain", {}), steps) + run_problems("ddp", m.get("ddp", {}), steps)
    d = m.get("ddp", {})
    if (d.get("distributed_type"), d.get("world_size")) != ("MULTI_GPU", 1):
        problems.append(f"ddp: {d.get('distributed_type')} at world size {d.get('world_size')}, not MULTI_GPU at 1")
    if not m.get("nccl_initialised"):
        problems.append("no NCCL INFO line: NCCL was not initialised (NCCL_DEBUG=INFO)")
    if not m.get("ddp_vs_plain", math.inf) <= DDP_TOL:
        problems.append(f"DDP vs one plain process: {fmt(m.get('ddp_vs_plain'))} (> {DDP_TOL:g})")
    return verdict(problems, f"NCCL DDP at world size 1 = one plain process ({fmt(m['ddp_vs_plain'])})")


# ---- --sync-bn: two ranks on GPU 0 vs one process at the same global batch ----------------------------------------
SYNC_BN_TOL = 1e-4  # SyncBatchNorm's gathered statistics vs one process's, summed in another order
SYNC_BN_RATIO = 10  # the unsynchronised control must be at least this many times farther from one process
# (on the CPU analogue, bn_net after 6 steps: synced 1.8e-7, unsynced 2.2e-3 from one process)
SYNC_BN_STEPS = 6  # round-off between the layouts grows with every step; 6 keep it far below the control's gap
SHARED_GPU_REFUSALS = (r"(RuntimeError|NotImplementedError|ValueError).*(not supported|does not support|unsupported"
                       r"|Duplicate GPU)",)  # fmt: skip


def sync_bn_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--global-batch-size", "32", "--max-steps", str(SYNC_BN_STEPS)]
    args += ["--log-every", "1", "--threads", "4"]

    def ranks(label: str, *extra: str) -> Step:
        out = ctx.work / "sync-bn" / label
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        argv = [*torchrun, "-m", "benchmarks.gpu_acceptance.probe", "shared-gpu-rank", *args, *extra, *FAST]
        argv += ["--output-dir", str(out)]
        return Step(label, argv, {**GPU0, **DETERMINISTIC}, out, refusals=SHARED_GPU_REFUSALS)

    steps = [
        train_step("one", ctx, "sync-bn", *args, env=DETERMINISTIC),
        ranks("synced", "--sync-bn"),
        ranks("unsynced"),
    ]
    return Check(
        "sync-bn",
        "two ranks on GPU 0 (gloo with CUDA tensors) with --sync-bn vs one process at the same global batch "
        f"(32 = 2 x 16), a BatchNorm CNN, {SYNC_BN_STEPS} SGD steps; the same two ranks without --sync-bn are the "
        "control",
        f"synced ranks within {SYNC_BN_TOL:g} of one process, and the control at least {SYNC_BN_RATIO}x "
        f"farther and {SYNC_BN_TOL:g} away (else the comparison proves nothing); 'not run' with torch's line if "
        "it refuses two ranks on one GPU",
        60, steps, measure_sync_bn, judge_sync_bn,
        exercises="CUDA SyncBatchNorm inside DDP across two processes (both on GPU 0, over gloo, not NCCL)",
        expected_steps=SYNC_BN_STEPS,
    )  # fmt: skip


def measure_sync_bn(ctx, outputs, check) -> dict[str, Any]:
    one, synced, control = (check.step(k).out_dir for k in ("one", "synced", "unsynced"))
    return {
        "one": run_facts(one),
        "synced": run_facts(synced),
        "unsynced": run_facts(control),
        "expected_steps": check.expected_steps,
        "converted": bool(re.search(r"sync-bn: converted \d+ BatchNorm layers", outputs["synced"].output)),
        "synced_vs_one": tensor_diff(weights(one), weights(synced)),
        "unsynced_vs_one": tensor_diff(weights(one), weights(control)),
    }


def judge_sync_bn(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name, size in (("one", 1), ("synced", 2), ("unsynced", 2)):
        f = m.get(name, {})
        problems += run_problems(name, f, steps)
        if f.get("world_size") != size:
            problems.append(f"{name}: world size {f.get('world_size')}, expected {size}")
    if len({m.get(k, {}).get("global_batch") for k in ("one", "synced", "unsynced")}) != 1:
        problems.append("the runs' global batches differ")
    if not m.get("converted"):
        problems.append("the synced run did not convert its BatchNorm layers")
    synced, control = m.get("synced_vs_one", math.inf), m.get("unsynced_vs_one", 0.0)
    if not synced <= SYNC_BN_TOL:
        problems.append(f"2 synced ranks vs 1 process: {fmt(synced)} (> {SYNC_BN_TOL:g})")
    if not control >= max(SYNC_BN_TOL, SYNC_BN_RATIO * synced):
        problems.append(
            f"the control (2 ranks without --sync-bn) is {fmt(control)} from 1 process, not {SYNC_BN_RATIO}x farther "
            f"than the synced ranks ({fmt(synced)}) and {SYNC_BN_TOL:g}: the comparison cannot tell them apart"
        )
    return verdict(problems, (
        f"2 ranks on GPU 0 with --sync-bn vs 1 process: {fmt(m['synced_vs_one'])}; without --sync-bn: "
        f"{fmt(m['unsynced_vs_one'])}"
    ))  # fmt: skip


# ---- DataParallel with device_ids=[0, 0] --------------------------------------------------------------------------
DP_TOL = 1e-5  # DataParallel's reduced gradient vs one module's, fp32 with TF32 off


def dp_check(ctx: Context) -> Check:
    return Check(
        "dp", "accel_train's AutocastDataParallel with device_ids=[0, 0]: two replicas, both on GPU 0",
        f"two replica threads run on cuda:0 in bf16 under bf16 autocast, and an fp32 step's gradients are within "
        f"{DP_TOL:g} of one module's; 'not run' with torch's reason if it refuses the duplicate device",
        15, [probe_step("probe", ctx, "dp", "data-parallel", env=DETERMINISTIC)],
        measure_data_parallel, judge_data_parallel,
        exercises="the DataParallel wrapper's replica threads on CUDA (not a split across GPUs)",
    )  # fmt: skip


def measure_data_parallel(ctx, outputs, check) -> dict[str, Any]:
    return json.loads(Path(check.step("probe").argv[-1]).read_text())


def judge_data_parallel(m: dict[str, Any]) -> tuple[str, str]:
    if m.get("refused"):
        return NOT_RUN, f"torch refused DataParallel(device_ids=[0, 0]): {m['refused']}"
    problems = []
    if m.get("replica_calls") != 2 or m.get("replica_threads") != 2:
        problems.append(
            f"{m.get('replica_calls')} replica calls in {m.get('replica_threads')} threads, expected 2 in 2"
        )
    if m.get("main_thread_ran_a_replica"):
        problems.append("a replica ran on the main thread, not in parallel_apply's threads")
    if m.get("replica_devices") != ["cuda:0"]:
        problems.append(f"replicas ran on {m.get('replica_devices')}, not cuda:0")
    if m.get("replica_dtypes") != ["torch.bfloat16"]:
        problems.append(f"replicas computed in {m.get('replica_dtypes')} under bf16 autocast")
    if not m.get("grad_max_abs_diff", math.inf) <= DP_TOL:
        problems.append(f"gradients vs one module: {fmt(m.get('grad_max_abs_diff'))} (> {DP_TOL:g})")
    return verdict(problems, (
        f"2 replica threads on cuda:0 in bf16; fp32 gradients = one module's ({fmt(m['grad_max_abs_diff'])} of "
        f"{fmt(m.get('grad_max_abs'))})"
    ))  # fmt: skip


# ---- two GPUs: DataParallel vs DDP --------------------------------------------------------------------------------
SGD_LENET = ["--model", "lenet", *SGD, "--global-batch-size", "32", "--max-steps", "20", "--log-every", "1"]


def dp_ddp_check(ctx: Context) -> Check:
    gpus01 = ("--gpu_ids", "0,1")
    steps = [
        train_step("dp", ctx, "dp_ddp", *SGD_LENET, config="dp.yaml", launch_args=gpus01, env=DETERMINISTIC),
        train_step("ddp", ctx, "dp_ddp", *SGD_LENET, config="multi_gpu.yaml",
                   launch_args=("--num_processes", "2", *gpus01), env=DETERMINISTIC),
    ]  # fmt: skip
    return Check(
        "dp_ddp", "DataParallel (1 process, GPUs 0,1) vs DDP (2 processes), lenet, global batch 32, 20 steps",
        f"both exit 0 and their weights are within {DDP_TOL:g}", 75, steps,
        measure_dp_ddp, judge_dp_ddp, min_gpus=2, exercises="two GPUs: not in the one-GPU plan",
    )  # fmt: skip


def measure_dp_ddp(ctx, outputs, check) -> dict[str, Any]:
    dp, ddp = check.step("dp").out_dir, check.step("ddp").out_dir
    s_dp, s_ddp = summary(dp), summary(ddp)
    return {
        "layout": [s_dp.get("data_parallel"), s_dp.get("world_size"), s_ddp.get("world_size")],
        "dp_vs_ddp": tensor_diff(weights(dp), weights(ddp)),
    }


def judge_dp_ddp(m: dict[str, Any]) -> tuple[str, str]:
    problems = []
    if m.get("layout") != [True, 1, 2]:
        problems.append(f"expected DataParallel in 1 process and DDP in 2, got {m.get('layout')}")
    if not m.get("dp_vs_ddp", math.inf) <= DDP_TOL:
        problems.append(f"DataParallel vs DDP: {fmt(m.get('dp_vs_ddp'))} (> {DDP_TOL:g})")
    return verdict(problems, f"DataParallel on GPUs 0,1 = DDP on 2 processes ({fmt(m['dp_vs_ddp'])})")
