"""What a user waits for around training: ``python scripts/train.py --help``, and the default run (``python
scripts/train.py``) timed from process start, with the breakdown its summary gives (interpreter and imports,
set-up, training, what follows the last metrics event)."""

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
from benchmarks.setups import TRAIN_SCRIPT


def time_train_help(runs: int = 3) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(TRAIN_SCRIPT), "--help"],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": times}
    return {"median_s": statistics.median(times), "runs_s": times}


def time_default_run(work: Path, runs: int = 2) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults (lenet on digits, 8 epochs), timed from process start.

    The breakdown comes from the run's summary.json: ``before_fit_s`` is the interpreter, imports and
    argument parsing (process wall minus ``wall_time_s``), ``setup_s`` the run's own set-up (data,
    model, Accelerator, run folder, and the imports ``fit`` does lazily), ``train_s`` the steps,
    evaluations and exports up to the last ``metrics.jsonl`` event, ``finish_s`` what follows it (plots,
    summary). The median run by wall time is reported.
    """
    rows = []
    for i in range(runs):
        out = work / f"default_run_{i}"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(TRAIN_SCRIPT), "--output-dir", str(out)],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": [r["process_wall_s"] for r in rows]}
        summary = _load_json(out / "summary.json") or {}
        fit_s, setup_s = summary.get("wall_time_s") or 0.0, summary.get("setup_s") or 0.0
        records = [r for events in read_metrics(out).values() for r in events]
        last_t = max((r.get("time_s", 0.0) for r in records), default=0.0)
        rows.append(
            {
                "process_wall_s": wall,
                "before_fit_s": wall - fit_s,
                "setup_s": setup_s,
                "train_s": last_t,
                "finish_s": max(fit_s - setup_s - last_t, 0.0),
                "eval_accuracy": summary.get("eval_accuracy"),
            }
        )
    median = sorted(rows, key=lambda r: r["process_wall_s"])[(len(rows) - 1) // 2]
    return {**median, "runs_s": [r["process_wall_s"] for r in rows], "command": "python scripts/train.py"}
