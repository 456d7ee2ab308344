"""``fit(cfg)``: one training run, from the run folder's checks to the summary.

The Accelerator comes from ``runtime``, every input from ``build``, the loop
itself is ``trainer.Trainer``. This module owns what wraps a run: the folder is
checked before anything loads, locked while the run writes, and with
``--overwrite`` the previous run is put back if this one fails before its first
checkpoint.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accel_train.checkpoint.safe_load import PROGRESS_FILE
from accel_train.checkpoint.state import read_progress, resolve_resume
from accel_train.config import TrainConfig, check_saved_config
from accel_train.heap import importing
from accel_train.resume import finished_note, reconcile
from accel_train.run_dir import SUMMARY, RunDir

if TYPE_CHECKING:
    from torch import nn

    from accel_train.data.base import DataSplits

__all__ = ["fit"]


def fit(
    cfg: TrainConfig, *, model: nn.Module | None = None, splits: DataSplits | None = None, task: Any = None
) -> dict[str, Any]:
    """Train, evaluate, checkpoint and export according to ``cfg``; returns the summary.

    ``model``/``splits``: the caller's own module and data instead of ``cfg.model``/``cfg.dataset``
    (see :func:`accel_train.api.train`); ``task``: what a batch is and how the run is scored (default:
    image classification; :mod:`accel_train.tasks`).
    """
    t_launch = time.perf_counter()
    run_dir = RunDir(cfg.output_dir)
    main = os.environ.get("RANK", "0") == "0"
    try:
        if main:  # a replacement a killed run left half-done is finished or undone first, under the lock
            for note in run_dir.recover_if_interrupted():
                print(f"accel_train: {note}", flush=True)
            run_dir.refuse_if_locked()  # a second writer is refused before it reads or loads anything
        run_dir.check(cfg.resume, cfg.overwrite)  # before anything is loaded or written
        return _fit(cfg, run_dir, t_launch, model, splits, task)
    finally:
        run_dir.lock.release()


def _fit(cfg: TrainConfig, run_dir: RunDir, t_launch: float, model, splits, task=None) -> dict[str, Any]:
    # resolved once (--resume auto scans the checkpoints): the config is restored before the runtime (precision,
    # threads, compile), the checkpoint loaded by build_trainer
    cfg, resume_path, changes, finished = _restore_resumed_config(cfg, run_dir)
    if finished:
        if os.environ.get("RANK", "0") == "0":
            print(finished, flush=True)
        return {"finished": True}
    with importing():  # in a command's own process: no garbage collection while they load, then frozen
        # torch's optimizers, accelerate and the data libraries load only now: a refused folder or a finished run
        # answers without them
        import torch._dynamo  # noqa: F401  (every torch.optim optimizer imports it when made)

        from accel_train.build import build_trainer
        from accel_train.runtime import build_runtime
        from accel_train.tracking import trackers_for

    # a resumed run logs into the tracker runs its checkpoint names (MLflow's run, W&B's, ...), not into new ones
    resumed = read_progress(resume_path) if resume_path is not None else None
    log_with = trackers_for(cfg.report_to, run_dir, resumed) or None
    rt = build_runtime(cfg, log_with=log_with, project_dir=run_dir.path)
    try:
        trainer = build_trainer(cfg, rt, run_dir, resume_path, changes, model=model, splits=splits, task=task)
        return trainer.run(t_launch)
    except BaseException:
        if rt.is_main and run_dir.restore_replaced():  # only the lock's holder that staged the run
            print(
                f"accel_train: this run failed before saving a checkpoint; the previous run in {run_dir.path} "
                "is restored",
                file=sys.stderr,
                flush=True,
            )
        raise


def _restore_resumed_config(
    cfg: TrainConfig, run_dir: RunDir
) -> tuple[TrainConfig, Path | None, dict[str, Any], str | None]:
    """With --resume: the saved run's config plus the allowed changes of ``cfg`` (see ``resume.py``).

    Returns that config (``cfg`` itself without --resume), the checkpoint to resume from (None without
    --resume), the changes (for the ``resume`` event) and, for a run that already finished and is not
    extended, the line that says so (nothing is then loaded or written).
    """
    path = resolve_resume(cfg.resume, run_dir)
    if path is None:
        return cfg, None, {}, None
    progress = read_progress(path)
    saved, resolved = progress.get("config"), progress.get("resolved")
    if not isinstance(saved, dict) or not isinstance(resolved, dict):
        return cfg, path, {}, None  # checkpoints of early versions: nothing to restore from
    check_saved_config(saved, str(path / PROGRESS_FILE))
    cfg, changes = reconcile(cfg, saved, resolved)
    done = progress.get("state", {}).get("global_step")
    if cfg.extend or not (run_dir / SUMMARY).is_file() or not isinstance(done, int):
        return cfg, path, changes, None
    return cfg, path, changes, finished_note(run_dir.path, done, resolved.get("total_steps"))
