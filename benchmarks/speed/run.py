"""One speed benchmark from start to end (``run_benchmark``): the machine, the grid of cells (each setup and model:
the plain loop right next to the portable run), the bf16 study, time to accuracy, the default run, the step's
overhead, the speed run; then ``benchmark.json``, ``benchmark.md`` and ``benchmark.png`` (this folder's
``__init__`` says which module does which part). Its children start as ``python -m benchmarks.speed.run --child
KIND SPEC``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accel_train.runtime import available_cores
from benchmarks.common import _load_json, _ratio
from benchmarks.speed.devices import one_gpu_env, visible_devices
from benchmarks.speed.goals import _speedrun_goals, evaluate_goals
from benchmarks.speed.machine import machine_info
from benchmarks.speed.plain_server import ServerPool, _child_server, plain_command
from benchmarks.speed.portable import run_portable, write_wrapper
from benchmarks.speed.report import render_markdown, update_readme, write_chart
from benchmarks.speed.results import aggregate
from benchmarks.speed.setups import (
    CUDA_SETUPS,
    MODELS,
    QUICK_CELLS,
    SETUPS,
    STUDY_MODELS,
    WARMUP_STEPS,
    WINDOW_STEPS,
    WORKLOADS,
    BenchOptions,
    Setup,
    select_workload,
)
from benchmarks.speed.speedrun import run_speedrun
from benchmarks.speed.startup import time_default_run, time_train_help
from benchmarks.speed.step_overhead import run_step_overhead, step_overhead_goals
from benchmarks.speed.study import _study_variants
from benchmarks.speed.time_to_accuracy import _child_seed000, time_to_accuracy


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


def run_speedrun_if_asked(opts: BenchOptions, work: Path, with_cuda: bool) -> dict[str, Any]:
    """airbench's recipe on CIFAR-10 (benchmarks.speed.speedrun): by default only where a GPU is visible."""
    wanted = opts.speedrun if opts.speedrun is not None else with_cuda and not opts.smoke
    if not wanted:
        return {"skipped": "no GPU visible; on a 2-core CPU the recipe takes about an hour (--speedrun runs it)"}
    opts.log("bench: CIFAR-10 time to 94% with the airbench recipe")
    return run_speedrun(opts.data_dir, work, one_gpu_env(), with_cuda, smoke=opts.smoke)


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


def _log_setups(opts: BenchOptions, setups: Sequence[Setup]) -> None:
    """A note for each setup the ``--models`` given leave nothing to measure, and on which GPU each CUDA setup runs."""
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


def _settings(opts: BenchOptions, setups: Sequence[Setup]) -> dict[str, Any]:
    """The report's ``settings``: how this run measured (mode, repeats, workloads, cells, the command)."""
    return {
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
    }


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
    _log_setups(opts, setups)
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
        step_rows = None if opts.smoke else run_step_overhead(rounds=5 if opts.mode == "quick" else 15)
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
        "settings": _settings(opts, setups),
        "results": results,
        "goals": evaluate_goals(results, t2a, help_timing, default_run, machine.get("cpu_bf16_kind", "unknown"))
        + _speedrun_goals(speedrun)
        + step_overhead_goals(step_rows or [], machine.get("cpu_bf16_kind", "unknown")),
        "default_run": default_run,
        "step_overhead": step_rows,
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
        update_readme(opts.readme, report, out)
        opts.log(f"bench: rewrote the benchmark block of {opts.readme}")
    opts.log(f"bench: wrote {out / 'benchmark.json'}, benchmark.md, benchmark.png in {report['total_wall_s']:.0f}s")
    return report


def _child_main(argv: Sequence[str]) -> None:
    kind, spec_path = argv[1], argv[2]
    spec = _load_json(Path(spec_path))
    {"server": _child_server, "seed000": _child_seed000}[kind](spec)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child_main(sys.argv[1:])
    else:
        sys.exit("usage: python -m benchmarks --help (this module's command line is for its children)")
