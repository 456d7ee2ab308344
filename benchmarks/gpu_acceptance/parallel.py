"""The judges of the GPU checks that run more than one replica: ``ddp`` (NCCL at world size 1 against one plain
process), ``sync-bn`` (two synced ranks on GPU 0, with an unsynced control), ``dp`` (DataParallel's replica
threads), ``device-batch`` (the out-of-memory probe, then the data on the GPU) and the two-GPU ``dp_ddp``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import NOT_RUN
from benchmarks.gpu_acceptance.runs import _g, _run_facts, _run_problems, _verdict, summary, tensor_diff, weights

DDP_TOL = 1e-5  # DDP over NCCL at world size 1 vs one plain process: the same math
SYNC_BN_TOL = 1e-4  # SyncBatchNorm's gathered statistics vs one process's, summed in another order
SYNC_BN_RATIO = 10  # the unsynchronised control must be at least this many times farther from one process
# (on the CPU analogue, bn_net after 6 steps: synced 1.8e-7, unsynced 2.2e-3 from one process)
DP_TOL = 1e-5  # DataParallel's reduced gradient vs one module's, fp32 with TF32 off


# ---- DDP over NCCL at world size 1 -----------------------------------------------------------------------------
def measure_ddp(ctx, outputs, check) -> dict[str, Any]:
    plain, ddp = check.step("plain").out_dir, check.step("ddp").out_dir
    return {
        "plain": _run_facts(plain),
        "ddp": _run_facts(ddp),
        "expected_steps": check.expected_steps,
        "nccl_initialised": bool(re.search(r"NCCL INFO", outputs["ddp"].output)),
        "ddp_vs_plain": tensor_diff(weights(plain), weights(ddp)),
    }


def judge_ddp(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    problems += _run_problems("plain", m.get("plain", {}), steps) + _run_problems("ddp", m.get("ddp", {}), steps)
    d = m.get("ddp", {})
    if (d.get("distributed_type"), d.get("world_size")) != ("MULTI_GPU", 1):
        problems.append(f"ddp: {d.get('distributed_type')} at world size {d.get('world_size')}, not MULTI_GPU at 1")
    if not m.get("nccl_initialised"):
        problems.append("no NCCL INFO line: NCCL was not initialised (NCCL_DEBUG=INFO)")
    if not m.get("ddp_vs_plain", math.inf) <= DDP_TOL:
        problems.append(f"DDP vs one plain process: {_g(m.get('ddp_vs_plain'))} (> {DDP_TOL:g})")
    return _verdict(problems, f"NCCL DDP at world size 1 = one plain process ({_g(m['ddp_vs_plain'])})")


# ---- --sync-bn: two ranks on GPU 0 vs one process at the same global batch ----------------------------------------
def measure_sync_bn(ctx, outputs, check) -> dict[str, Any]:
    one, synced, control = (check.step(k).out_dir for k in ("one", "synced", "unsynced"))
    return {
        "one": _run_facts(one),
        "synced": _run_facts(synced),
        "unsynced": _run_facts(control),
        "expected_steps": check.expected_steps,
        "converted": bool(re.search(r"sync-bn: converted \d+ BatchNorm layers", outputs["synced"].output)),
        "synced_vs_one": tensor_diff(weights(one), weights(synced)),
        "unsynced_vs_one": tensor_diff(weights(one), weights(control)),
    }


def judge_sync_bn(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name, size in (("one", 1), ("synced", 2), ("unsynced", 2)):
        f = m.get(name, {})
        problems += _run_problems(name, f, steps)
        if f.get("world_size") != size:
            problems.append(f"{name}: world size {f.get('world_size')}, expected {size}")
    if len({m.get(k, {}).get("global_batch") for k in ("one", "synced", "unsynced")}) != 1:
        problems.append("the runs' global batches differ")
    if not m.get("converted"):
        problems.append("the synced run did not convert its BatchNorm layers")
    synced, control = m.get("synced_vs_one", math.inf), m.get("unsynced_vs_one", 0.0)
    if not synced <= SYNC_BN_TOL:
        problems.append(f"2 synced ranks vs 1 process: {_g(synced)} (> {SYNC_BN_TOL:g})")
    if not control >= max(SYNC_BN_TOL, SYNC_BN_RATIO * synced):
        problems.append(
            f"the control (2 ranks without --sync-bn) is {_g(control)} from 1 process, not {SYNC_BN_RATIO}x farther "
            f"than the synced ranks ({_g(synced)}) and {SYNC_BN_TOL:g}: the comparison cannot tell them apart"
        )
    return _verdict(problems, (
        f"2 ranks on GPU 0 with --sync-bn vs 1 process: {_g(m['synced_vs_one'])}; without --sync-bn: "
        f"{_g(m['unsynced_vs_one'])}"
    ))  # fmt: skip


# ---- DataParallel with device_ids=[0, 0] -----------------------------------------------------------------------
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
        problems.append(f"gradients vs one module: {_g(m.get('grad_max_abs_diff'))} (> {DP_TOL:g})")
    return _verdict(problems, (
        f"2 replica threads on cuda:0 in bf16; fp32 gradients = one module's ({_g(m['grad_max_abs_diff'])} of "
        f"{_g(m.get('grad_max_abs'))})"
    ))  # fmt: skip


# ---- --max-device-batch auto with the data on the device --------------------------------------------------------
_AUTO = re.compile(r"--max-device-batch auto: (\d+) is the largest micro-batch")


def measure_device_batch(ctx, outputs, check) -> dict[str, Any]:
    run = check.step("auto").out_dir
    s = summary(run)
    hit = _AUTO.search(outputs["auto"].output)
    return {
        **_run_facts(run),
        "expected_steps": check.expected_steps,
        "expected_global_batch": check.global_batch,
        "probed_micro_batch": int(hit.group(1)) if hit else None,
        "peak_memory_mb": s.get("peak_memory_mb"),
        "reserved_memory_mb": s.get("peak_reserved_memory_mb"),
    }


def judge_device_batch(m: dict[str, Any]) -> tuple[str, str]:
    problems = _run_problems("auto", m, m.get("expected_steps"))
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
    return _verdict(problems, (
        f"probe chose micro-batch {micro} x {accum} for global {glob}; data on the GPU; peak "
        f"{m.get('peak_memory_mb')} MB allocated, {m.get('reserved_memory_mb')} MB reserved"
    ))  # fmt: skip


# ---- two GPUs: DataParallel vs DDP ------------------------------------------------------------------------------
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
        problems.append(f"DataParallel vs DDP: {_g(m.get('dp_vs_ddp'))} (> {DDP_TOL:g})")
    return _verdict(problems, f"DataParallel on GPUs 0,1 = DDP on 2 processes ({_g(m['dp_vs_ddp'])})")
