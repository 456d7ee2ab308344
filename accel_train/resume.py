"""What a resume may change: a resumed run is the run that was saved, plus explicit, recorded changes.

``--resume`` restores the saved configuration (``progress.json`` holds it). Flags given with
``--resume`` are sorted into three kinds:

* **per attempt** (how this attempt runs, never restored): ``--resume``, ``--output-dir``,
  ``--stop-at-step``, ``--branch``, ``--resume-inexact``, ``--resume-changed-data``, ``--extend``, ``--debug``;
* **safe** (they change how a run is watched, saved or computed, not what it learns): logging,
  evaluation and checkpoint cadence, trackers, threads, data workers, the data folder, the
  process-group timeout, precision, ``--compile``, ``--channels-last``, ``--sync-bn``, early stopping
  (``--early-stop-patience``/``--early-stop-min-delta``: its counter is in the checkpoint). Not given,
  they keep the saved value; given, they take effect and are recorded in the ``resume`` event;
* **the experiment** (everything else: model, data, batch, optimizer, LR and schedule, seed,
  length, ``--ema``, ``--label-smoothing``, ``--mixup``, ``--cutmix``): a different value is refused
  with one line naming the flag, except the length (``--epochs``/``--max-steps``), which
  ``--extend`` may make longer.

An extended run keeps its schedule's shape *as if it had been planned for the new length from
the start*: the LR is a pure function of (step, total steps), so after 352 of a planned 352 cosine
steps an extension to 440 continues from the cosine's value at 352/440 (about 9.5% of the peak),
never at an LR of 0.

**The data.** A run records what it trains on (``data.identity``: a folder's files, shards, an ``hf:`` fingerprint)
in its config.yaml and every checkpoint; :func:`data_change` compares it with the data as it is now. A resume on
other data is refused in one line that says what changed, unless ``--resume-changed-data`` accepts it (then the
resume says it is not exact).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import fields
from typing import Any

from accel_train.config import TrainConfig
from accel_train.errors import UserError
from accel_train.flags import ATTEMPT
from accel_train.flags import LENGTH as LENGTH_KIND
from accel_train.flags import SAFE as SAFE_KIND
from accel_train.run_dir import SUMMARY


def _marked(kind: str) -> frozenset[str]:
    return frozenset(f.name for f in fields(TrainConfig) if f.metadata.get("resume") == kind)


# Each field says which kind it is, where it is declared (metadata ``resume``, see ``flags.ATTEMPT``)
PER_ATTEMPT, SAFE, LENGTH = _marked(ATTEMPT), _marked(SAFE_KIND), _marked(LENGTH_KIND)
BATCH = ("batch_size", "global_batch_size", "grad_accum_steps", "max_device_batch")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def given_fields(cfg: TrainConfig) -> frozenset[str]:
    """Fields the user set (flags or ``--config`` YAML); every field when ``cfg`` was built in code."""
    given = getattr(cfg, "given", None)
    return frozenset(f.name for f in fields(TrainConfig)) if given is None else frozenset(given)


def reconcile(
    cfg: TrainConfig, saved: dict[str, Any], resolved: dict[str, Any]
) -> tuple[TrainConfig, dict[str, list[Any]]]:
    """The saved run's config plus the allowed changes of ``cfg``, and those changes (``{field: [old, new]}``).

    ``saved`` is the run's config from its checkpoint, ``resolved`` what it resolved to (global batch).
    Raises ``UserError`` for a change to the experiment, or a length change without ``--extend``.
    """
    given = given_fields(cfg)
    changes: dict[str, list[Any]] = {}
    restored: dict[str, Any] = {}
    refused: list[str] = []
    for f in fields(TrainConfig):
        name = f.name
        if name in PER_ATTEMPT or name not in saved:
            continue  # a field newer than the checkpoint keeps this attempt's value
        old, new = saved[name], getattr(cfg, name)
        if name not in given:
            restored[name] = old
        elif new != old:
            if name in SAFE or (name in LENGTH and cfg.extend) or (name == "dataset" and _moved(old, new, resolved)):
                changes[name] = [old, new]
            else:
                refused.append(name)
    if refused:
        raise UserError(_refusal(refused, saved))
    restored.update(_keep_global_batch(cfg.max_device_batch, given, resolved))
    return dataclasses.replace(cfg, **restored), changes


def _moved(old: Any, new: Any, resolved: dict[str, Any]) -> bool:
    """The same kind of folder under another path (moved, or named another way): allowed when the run recorded
    its data, which the resume then compares with what the new path holds (refused if it differs)."""
    kinds = ("imagefolder:", "shards:", "hf:")
    same_kind = isinstance(old, str) and isinstance(new, str) and old.split(":")[0] == new.split(":")[0]
    return same_kind and old.startswith(kinds) and isinstance((resolved or {}).get("data"), dict)


def _refusal(names: list[str], saved: dict[str, Any]) -> str:
    shown = ", ".join(f"{_flag(n)} (the run has {saved[n]!r})" for n in names)
    if all(n in LENGTH for n in names):
        return (
            f"{shown}: a resume continues the run as it was planned; pass --extend to make it longer (the LR "
            "schedule is re-planned for the new length), or drop the flag"
        )
    return (
        f"{shown}: a resume continues the same experiment, so it cannot change that; drop the flag (the saved "
        "value is used), or start a new run in another --output-dir (or with --overwrite)"
    )


def _keep_global_batch(cap: int | str | None, given: frozenset[str], resolved: dict[str, Any]) -> dict[str, Any]:
    """Same optimizer batch on any number of processes: a resume without batch flags keeps the saved global batch
    (the batch fields to set; ``cap``: this attempt's --max-device-batch)."""
    global_batch, micro = resolved.get("global_batch"), resolved.get("micro_batch")
    if not isinstance(global_batch, int) or any(name in given for name in BATCH):
        return {}
    cap = cap or (micro if isinstance(micro, int) else None)
    return {"global_batch_size": global_batch, "grad_accum_steps": 1, "max_device_batch": cap}


def check_extension(cfg: TrainConfig, done_steps: int, total_steps: int) -> None:
    """``--extend`` must leave steps to train."""
    if cfg.extend and total_steps <= done_steps:
        what = f"--max-steps {cfg.max_steps}" if cfg.max_steps else f"--epochs {cfg.epochs}"
        raise UserError(
            f"--extend with {what} gives {total_steps} steps, but the run has already trained {done_steps}; "
            "pass a larger --epochs or --max-steps"
        )


def finished_note(run_folder: str | os.PathLike, done_steps: int, planned_steps: Any) -> str | None:
    """The line for a resume of a run that has already trained all its planned steps (None otherwise)."""
    if not isinstance(planned_steps, int) or done_steps < planned_steps:
        return None
    return (
        f"accel_train: the run in {run_folder} already finished ({done_steps} of {planned_steps} steps; see its "
        f"{SUMMARY}); nothing to do. To train it longer pass --extend with a larger --epochs or --max-steps"
    )


def data_change(progress: dict[str, Any], ident, files: Any = None) -> str | None:
    """What changed in the data since the checkpoint whose ``progress`` is given, in words (None: nothing, or the
    checkpoint predates the record). ``ident``: the data's identity now; ``files``: the run's recorded file lists."""
    from accel_train.data.identity import changes

    resolved = progress.get("resolved")
    recorded = resolved.get("data") if isinstance(resolved, dict) else None
    if ident is None or not isinstance(recorded, dict):
        return None
    return changes(recorded, ident, files)


def data_refusal(dataset: str, step: int, change: str) -> str:
    return (
        f"--resume: {dataset} is not the data the checkpoint at step {step} trained on: {change}; restore the data "
        "as it was and resume again, or start a new run (another --output-dir, or --overwrite); "
        "--resume-changed-data goes on with the data as it is now (not an exact resume)"
    )
