"""``--branch``: resuming from an older checkpoint abandons the newer timeline, whole.

The newer checkpoints, the metrics logged after the branch point and everything else that describes the
abandoned timeline go to ``abandoned/<time>-after-step_N/`` (:meth:`RunDir.set_aside` moves them; the run
folder owns every name). ``best/`` goes too when an evaluation after the branch point rewrote it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from accel_train.checkpoint.state import list_checkpoints, read_progress
from accel_train.run_dir import BEST, CHECKPOINT_DIR, CONFIG, METRICS_CSV, TENSORBOARD, RunDir


def newer_checkpoints(run: RunDir, step: int, keep: Path) -> list[int]:
    """Steps of the run's checkpoints at or after ``step``, other than ``keep`` (the one resumed from)."""
    return [s for s, p in list_checkpoints(run) if s >= step and p.resolve() != keep.resolve()]


def abandon_after(run: RunDir, step: int, keep: Path) -> Path | None:
    """Move checkpoints after ``step`` (except ``keep``), the metrics logged after it and everything else that
    describes the abandoned timeline to ``abandoned/``; returns that folder (None: nothing newer)."""
    newer = [p for s, p in list_checkpoints(run) if s >= step and p.resolve() != keep.resolve()]
    if not newer:
        return None
    lines = run.metrics.read_text().splitlines(keepends=True) if run.metrics.is_file() else []
    kept = "".join(line for line in lines if not _logged_after(line, step))
    best = (BEST,) if _best_written_after(lines, step, keep) else ()
    dest = run.set_aside(run.metrics, f"after-step_{step}", extra=(CONFIG, *best), keep_log=kept)
    assert dest is not None  # keep_log given: always made
    (dest / CHECKPOINT_DIR).mkdir()
    for p in newer:
        os.replace(p, dest / CHECKPOINT_DIR / p.name)
    _keep_tracker_records(run, dest, step)
    return dest


def _keep_tracker_records(run: RunDir, dest: Path, step: int) -> None:
    """What the trackers recorded of the kept timeline stays, as metrics.jsonl's lines up to ``step`` do:
    metrics.csv's rows up to ``step``, and a copy of tb/ (TensorBoard hides its events after ``step``: the
    resumed run opens it with ``purge_step``). The abandoned folder keeps the whole of both."""
    import csv
    import shutil

    old_csv, tb = dest / METRICS_CSV, dest / TENSORBOARD
    if tb.is_dir() and not (run / TENSORBOARD).exists():
        shutil.copytree(tb, run / TENSORBOARD, symlinks=True)
    if not old_csv.is_file() or (run / METRICS_CSV).exists():
        return
    try:
        with open(old_csv, newline="") as fh:
            reader = csv.DictReader(fh)
            rows = [r for r in reader if not (r.get("step") or "").isdigit() or int(r["step"]) <= step]
            fields = list(reader.fieldnames or [])
    except (UnicodeDecodeError, csv.Error, ValueError):
        return  # a damaged file stays with the abandoned timeline (a resume starts a new one)
    with open(run / METRICS_CSV, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _logged_after(line: str, step: int) -> bool:
    try:
        return int(json.loads(line).get("step", 0)) > step
    except (ValueError, TypeError, AttributeError):
        return False


def _best_written_after(lines: list[str], step: int, keep: Path) -> bool:
    """Whether ``best/`` was rewritten after ``step``: an eval logged after it beat the best the checkpoint at
    ``step`` knew (or the log cannot tell)."""
    if not lines:
        return True
    best = read_progress(keep)["state"].get("best_metric")
    for line in lines:
        try:
            record = json.loads(line)
            if record.get("event") == "eval" and int(record["step"]) > step:
                acc = float(record["eval_accuracy"])
                if best is None or acc > best:
                    return True
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return False
