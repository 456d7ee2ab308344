"""What a user waits for around training: ``python scripts/train.py --help``, and the default run (``python
scripts/train.py``) timed from process start, with the breakdown its summary gives (interpreter and imports,
set-up, training, what follows the last metrics event) beside the start-up floor: the same work as a plain
PyTorch script (``plain_default_run.py``), launched alternately with it."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO, child_env
from accel_train.run_records import read_metrics
from benchmarks.common import _load_json, _tail
from benchmarks.speed.setups import TRAIN_SCRIPT


def _timed(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float, float]:
    """``python ARGS`` from the repository: (the process, its wall seconds from launch, launch time as time.time())."""
    t_launch, t0 = time.time(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc, time.perf_counter() - t0, t_launch


def time_train_help(runs: int = 3) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        proc, wall, _ = _timed(str(TRAIN_SCRIPT), "--help", timeout=120)
        times.append(wall)
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": times}
    return {"median_s": statistics.median(times), "runs_s": times}


PLAIN_SCRIPT = Path(__file__).resolve().with_name("plain_default_run.py")


def _one_default_run(out: Path) -> dict[str, Any]:
    """One ``python scripts/train.py --output-dir OUT``: the wall from launch and the summary's breakdown."""
    proc, wall, _ = _timed(str(TRAIN_SCRIPT), "--output-dir", str(out))
    if proc.returncode != 0:
        return {"error": _tail(proc.stderr)}
    summary = _load_json(out / "summary.json") or {}
    fit_s, setup_s = summary.get("wall_time_s") or 0.0, summary.get("setup_s") or 0.0
    records = [r for events in read_metrics(out).values() for r in events]
    last_t = max((r.get("time_s", 0.0) for r in records), default=0.0)
    return {
        "process_wall_s": wall,
        "before_fit_s": wall - fit_s,
        "setup_s": setup_s,
        "train_s": last_t,
        "finish_s": max(fit_s - setup_s - last_t, 0.0),
        "eval_accuracy": summary.get("eval_accuracy"),
    }


def _one_plain_run(stamps: Path) -> dict[str, Any]:
    """One ``python benchmarks/speed/plain_default_run.py``: the same work in a plain script, with its phases."""
    proc, wall, t_launch = _timed(str(PLAIN_SCRIPT), "--json", str(stamps))  # stamps are time.time() values
    if proc.returncode != 0 or not stamps.is_file():
        return {"error": _tail(proc.stderr)}
    s = _load_json(stamps)
    return {
        "process_wall_s": wall,
        "imports_s": s["imported"] - t_launch,
        "setup_s": s["setup_done"] - s["imported"],
        "train_s": s["trained"] - s["setup_done"],
        "finish_s": wall - (s["trained"] - t_launch),
        "steps": s["steps"],
        "evals": s["evals"],
        "eval_accuracy": s["accuracy"],
    }


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rows, key=lambda r: r["process_wall_s"])[(len(rows) - 1) // 2]


def time_default_run(work: Path, runs: int = 2, plain: bool = True) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults (lenet on digits, 8 epochs), timed from process start, and
    (``plain``) the same work as a plain PyTorch script (``benchmarks/speed/plain_default_run.py``), interleaved: ours,
    plain, ours, plain, ...

    The breakdown comes from the run's summary.json: ``before_fit_s`` is the interpreter, imports and
    argument parsing (process wall minus ``wall_time_s``), ``setup_s`` the run's own set-up (data,
    model, Accelerator, run folder, and the imports ``fit`` does lazily), ``train_s`` the steps,
    evaluations and exports up to the last ``metrics.jsonl`` event, ``finish_s`` what follows it (plots,
    summary). The median run by wall time is reported, with ``ratio_vs_plain`` = median ours / median plain
    (``ratio_vs_plain_min``: fastest / fastest, the figure least hurt by other processes on the CPU).
    """
    rows, plain_rows = [], []
    for i in range(runs):
        row = _one_default_run(work / f"default_run_{i}")
        if "error" in row:
            return {**row, "runs_s": [r["process_wall_s"] for r in rows]}
        rows.append(row)
        if plain:
            p = _one_plain_run(work / f"plain_default_run_{i}.json")
            if "error" in p:
                return {**_median_row(rows), "plain": p, "runs_s": [r["process_wall_s"] for r in rows]}
            plain_rows.append(p)
    out = {**_median_row(rows), "runs_s": [r["process_wall_s"] for r in rows], "command": "python scripts/train.py"}
    if plain_rows:
        ours_s, plain_s = [r["process_wall_s"] for r in rows], [r["process_wall_s"] for r in plain_rows]
        out["plain"] = {
            **_median_row(plain_rows),
            "runs_s": plain_s,
            "command": "python benchmarks/speed/plain_default_run.py",
        }
        out["ratio_vs_plain"] = statistics.median(ours_s) / statistics.median(plain_s)
        out["ratio_vs_plain_min"] = min(ours_s) / min(plain_s)
        out["pair_ratios"] = [o / p for o, p in zip(ours_s, plain_s, strict=True)]
    return out
