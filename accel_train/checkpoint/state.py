"""Resumable training checkpoints on top of ``accelerator.save_state``.

Layout: ``OUTPUT_DIR/checkpoints/step_00000120/`` holds accelerate's state
(model weights, optimizer, scheduler, grad scaler, one RNG file per rank)
plus ``progress.json`` (epoch, step in epoch, global step, samples seen, best
metric, model config). Progress is read from ``progress.json``, never from
folder names.

Saves are atomic: every rank writes into ``.tmp-step_…``; after a barrier the
main process writes ``progress.json`` last and renames the folder into place.
A save killed half-way leaves a ``.tmp-`` folder that ``--resume auto``
ignores and the next save removes.

Model weights are written unwrapped (no ``module.``/``_orig_mod.``) through
accelerate's save/load hooks, so a checkpoint from 2 DDP processes resumes in
one plain process and the other way round.
"""

from __future__ import annotations

import json
import os
import pickle  # only for pickle.UnpicklingError
import shutil
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel_train.errors import CheckpointError

CHECKPOINT_DIR = "checkpoints"
PROGRESS_FILE = "progress.json"
TMP_PREFIX = ".tmp-"


@dataclass
class TrainState:
    """Progress that travels inside every checkpoint."""

    epoch: int = 0
    step_in_epoch: int = 0  # optimizer steps already taken in `epoch`
    global_step: int = 0
    samples_seen: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    nonfinite_skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _strip_prefixes(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in ("module.", "_orig_mod."):
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def install_unwrapped_weight_hooks(accelerator) -> None:
    """Make ``save_state``/``load_state`` use unwrapped model keys on every setup."""

    def save_hook(models, weights, output_dir):
        for i, sd in enumerate(weights):
            weights[i] = {_strip_prefixes(k): v for k, v in sd.items()}

    def load_hook(models, input_dir):
        from safetensors.torch import load_file

        for i in reversed(range(len(models))):
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            path = Path(input_dir) / name
            if not path.exists():
                continue  # leave it to accelerate (e.g. pytorch_model.bin)
            target = accelerator.unwrap_model(models[i], keep_torch_compile=False)
            state = load_file(str(path), device="cpu")
            try:
                target.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                raise CheckpointError(
                    f"checkpoint {input_dir} does not fit this model ({str(exc).splitlines()[0]}); "
                    "resume with the same --model, dataset and image size, or start a new --output-dir"
                ) from None
            models.pop(i)  # loaded here: accelerate must not load it again with wrapped keys

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (global_step, path), oldest first; partial ones are skipped."""
    root = Path(output_dir) / CHECKPOINT_DIR
    found = []
    if not root.is_dir():
        return found
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX) or not path.is_dir():
            continue
        try:
            progress = json.loads((path / PROGRESS_FILE).read_text())
            found.append((int(progress["state"]["global_step"]), path))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # incomplete or foreign folder
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """``auto`` -> latest complete checkpoint or None; ``none`` -> None; else a checkpoint path."""
    if resume == "none":
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if path.is_dir() and (path / PROGRESS_FILE).exists():
        return path
    if path.is_dir() and list_checkpoints(path):  # a run directory: take its latest
        return latest_checkpoint(path)
    raise CheckpointError(
        f"--resume {resume!r} is not a checkpoint folder (no {PROGRESS_FILE}); pass a folder under "
        f"OUTPUT_DIR/{CHECKPOINT_DIR}/, a run directory, or 'auto'"
    )


def read_progress(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / PROGRESS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot read {Path(path) / PROGRESS_FILE}: {exc}; the checkpoint is incomplete, resume from "
            "another checkpoint or start a new --output-dir"
        ) from None


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    accelerator, output_dir: str | Path, state: TrainState, meta: dict[str, Any], keep_last: int
) -> Path:
    """Collective: call on every rank. Returns the final checkpoint path."""
    root = Path(output_dir) / CHECKPOINT_DIR
    name = f"step_{state.global_step:08d}"
    tmp, final = root / f"{TMP_PREFIX}{name}", root / name
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{TMP_PREFIX}*"):  # leftovers of a killed save
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_json_atomic(tmp / PROGRESS_FILE, {"state": state.to_dict(), **meta})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in list_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str | Path) -> tuple[TrainState, dict[str, Any]]:
    """Collective: restore accelerate's state from ``path`` and return the progress."""
    progress = read_progress(path)
    rng = Path(path) / f"random_states_{accelerator.process_index}.pkl"
    if rng.is_file() and not zipfile.is_zipfile(rng):  # accelerate would skip it silently: resume not exact
        raise CheckpointError(
            f"cannot resume from {path}: {rng.name} is truncated or corrupt; resume from an older checkpoint "
            f"in {Path(path).parent}, or start a new --output-dir"
        )
    from safetensors import SafetensorError

    try:
        accelerator.load_state(str(path))
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        # a truncated/corrupt file (our load hook's CheckpointError for another model passes through)
        reason = " ".join(str(exc).split()).split(". ")[0][:200] or type(exc).__name__
        raise CheckpointError(
            f"cannot resume from {path}: a file in it is missing, truncated or corrupt "
            f"({type(exc).__name__}: {reason}); resume from an older checkpoint in {Path(path).parent}, "
            "or start a new --output-dir"
        ) from exc
    return TrainState.from_dict(progress["state"]), progress
