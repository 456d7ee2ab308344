"""From the raw measurements to the report's rows: per cell (setup, model) the medians of the portable and the
plain runs, their ratio, the best windows, MFU against the GEMM peak of the same dtype, memory, and each
setup's speed-up over ``cpu_fp32`` on the same workload."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.common import _median, _ratio
from benchmarks.speed.machine import flops_per_sample
from benchmarks.speed.setups import WARMUP_STEPS, BenchOptions, Setup


def aggregate(
    raw: dict[tuple[str, str], dict[str, list[dict[str, Any]]]],
    setups: Sequence[Setup],
    machine: dict[str, Any],
    opts: BenchOptions,
) -> list[dict[str, Any]]:
    by_name = {s.name: s for s in setups}
    results = []
    for (setup_name, model), runs in raw.items():
        results.append(_cell(by_name[setup_name], model, runs, machine, opts))
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if base and r["setup"] != "cpu_fp32" and base["workload"] == r["workload"]:
            r["speedup_vs_cpu_fp32"] = _ratio(r["samples_per_s"], base["samples_per_s"])
            r["plain_speedup_vs_cpu_fp32"] = _ratio(r["plain_samples_per_s"], base["plain_samples_per_s"])
    return results


def _cell(
    setup: Setup, model: str, runs: dict[str, list[dict[str, Any]]], machine: dict[str, Any], opts: BenchOptions
) -> dict[str, Any]:
    """One row of the report: the medians of a cell's portable and plain runs, their ratio, MFU, memory, errors."""
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
        "setup": setup.name,
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
    return entry
