"""``fit(cfg)``: one training run, from the run folder's checks to the summary.

The Accelerator comes from ``runtime``, every input from ``build``, the loop
itself is ``trainer.Trainer``. This module owns what wraps a run: the folder is
checked before anything loads, locked while the run writes, and with
``--overwrite`` the previous run is put back if this one fails before its first
checkpoint.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from accel_train.build import build_trainer
from accel_train.config import TrainConfig
from accel_train.run_dir import RunDir
from accel_train.runtime import build_runtime
from accel_train.tracking import trackers_for
from accel_train.trainer import WARMUP_STEPS_EXCLUDED

__all__ = ["WARMUP_STEPS_EXCLUDED", "fit"]


def fit(cfg: TrainConfig) -> dict[str, Any]:
    """Train, evaluate, checkpoint and export according to ``cfg``; returns the summary."""
    t_launch = time.perf_counter()
    run_dir = RunDir(cfg.output_dir)
    run_dir.check(cfg.resume, cfg.overwrite)  # before anything is loaded or written
    rt = build_runtime(cfg, log_with=trackers_for(cfg.report_to, cfg.output_dir) or None)
    try:
        if rt.is_main:
            run_dir.refuse_if_locked()  # a second writer is refused before it loads anything
        return build_trainer(cfg, rt, run_dir).fit(t_launch)
    except BaseException:
        if rt.is_main and run_dir.restore_replaced():
            print(
                f"accel_train: this run failed before saving a checkpoint; the previous run in {run_dir.path} "
                "is restored",
                file=sys.stderr,
                flush=True,
            )
        raise
    finally:
        run_dir.lock.release()
