"""Resumable training checkpoints on top of ``accelerator.save_state``.

Layout: ``OUTPUT_DIR/checkpoints/step_00000120/`` holds accelerate's state
(model weights, optimizer, grad scaler, one RNG file per rank) plus
``progress.json`` (epoch, step in epoch, global step, samples seen, best
metric, model config, and the LR schedule's state as JSON). Progress is read
from ``progress.json``, never from folder names.

Resume never unpickles code: :mod:`accel_train.checkpoint.safe_load` opens every
file of the folder safely (and refuses unknown ones) before accelerate reads
it, and nothing is registered with ``register_for_checkpointing`` (accelerate
loads such objects with ``weights_only=False``).

Saves are atomic: every rank writes into ``.tmp-step_…``; after a barrier the
main process writes ``progress.json`` last and renames the folder into place.
A save killed half-way leaves a ``.tmp-`` folder that ``--resume auto``
ignores and the next attempt removes; so does a kill while retention deletes
an old checkpoint (the folder is renamed to its ``.tmp-`` name first).

Model weights are written unwrapped (no ``module.``/``_orig_mod.``) through
accelerate's save/load hooks, so a checkpoint from 2 DDP processes resumes in
one plain process and the other way round.
"""

from __future__ import annotations

import json
import os
import pickle  # only for pickle.UnpicklingError
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel_train.checkpoint.keys import strip_key
from accel_train.checkpoint.metadata import check_progress
from accel_train.checkpoint.safe_load import PROGRESS_FILE, RNG_FILE, safe_torch_load, verify_checkpoint
from accel_train.checkpoint.weights import _standalone_tensors
from accel_train.errors import CheckpointError, UserError
from accel_train.fsio import WRITE_GUARD, tree_size, write_json_atomic, writing
from accel_train.limits import check_regular_file
from accel_train.run_dir import CHECKPOINT_DIR, TMP_PREFIX, RunDir, checkpoint_name, is_own_checkpoint_name

#: A run folder: its :class:`RunDir`, or the folder's path (wrapped in one).
Run = RunDir | str | os.PathLike


@dataclass
class TrainState:
    """Progress that travels inside every checkpoint."""

    epoch: int = 0
    step_in_epoch: int = 0  # optimizer steps already taken in `epoch`
    global_step: int = 0
    samples_seen: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    last_eval_step: int | None = None  # evaluated in training: an epoch's end at that step does not evaluate again
    nonfinite_skipped: int = 0
    fp16_skipped_steps: int = 0  # optimizer steps the fp16 loss scaler skipped (inf/NaN gradients)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def install_unwrapped_weight_hooks(accelerator) -> None:
    """Make ``save_state``/``load_state`` use unwrapped model keys on every setup."""

    def save_hook(models, weights, folder):
        # contiguous: safetensors refuses strided tensors, and --channels-last (the default for conv models in
        # bf16/fp16 on CUDA) leaves every 4-D weight in NHWC strides; loading copies back into the model's layout
        # and each tensor on its own storage, as exports are: safetensors refuses tied weights (a language model's
        # embeddings and output layer); loading copies the same values into the one shared parameter twice
        for i, sd in enumerate(weights):
            weights[i] = _standalone_tensors({strip_key(k): v for k, v in sd.items()})

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


def list_checkpoints(run: Run) -> list[tuple[int, Path]]:
    """The run's own complete checkpoints as (global_step, path), oldest first; partial, unreadable and foreign
    ones are skipped (:meth:`RunDir.checkpoint_folders` names them)."""
    found = []
    for path in RunDir.of(run).checkpoint_folders():
        try:
            found.append((read_progress(path)["state"]["global_step"], path))
        except CheckpointError:
            continue  # incomplete or foreign folder
    return sorted(found)


def _refuse_unusable_newest(run: RunDir) -> None:
    """``--resume auto`` must not start over silently: a checkpoint folder at least as new (by its name) as the
    latest usable one, whose progress.json is missing or invalid, is refused with the reason."""
    usable = {p.name for _, p in list_checkpoints(run)}
    newest = max(usable, default="")
    for path in reversed(run.checkpoint_folders()):
        if path.name in usable or path.name < newest:
            continue  # usable, or older than the newest usable one
        try:
            read_progress(path)
        except CheckpointError as exc:
            raise CheckpointError(
                f"--resume auto: the newest checkpoint cannot be used, so the run is not started over: {exc}; "
                "or pass --resume with an older checkpoint"
            ) from None


def latest_checkpoint(run: Run) -> Path | None:
    ckpts = list_checkpoints(run)
    return ckpts[-1][1] if ckpts else None


def resolve_resume(resume: str, run: Run) -> Path | None:
    """``auto`` -> the run's latest complete checkpoint or None; ``none`` -> None; else a checkpoint path (or a
    run folder: its latest)."""
    if resume == "none":
        return None
    if resume == "auto":
        _refuse_unusable_newest(RunDir.of(run))
        return latest_checkpoint(run)
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
    """``path/progress.json``, checked (``checkpoint.metadata.check_progress``): one line if it is unusable."""
    file = Path(path) / PROGRESS_FILE
    check_regular_file(file, "progress.json", CheckpointError)
    try:
        progress = check_progress(json.loads(file.read_text()), str(file))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(
            f"cannot read {Path(path) / PROGRESS_FILE}: {exc}; the checkpoint is incomplete, resume from "
            "another checkpoint or start a new --output-dir"
        ) from None
    name, step = Path(path).name, progress["state"]["global_step"]
    if is_own_checkpoint_name(name) and name != checkpoint_name(step):  # resume and retention go by the name
        raise CheckpointError(
            f"{path} holds step {step} (its progress.json), not step {int(name[5:])}: the folder was copied or "
            f"renamed; rename it to {checkpoint_name(step)} (or remove it), or resume from the one named for its step"
        )
    return progress


def _retire_old(run: RunDir, keep_last: int, keep: tuple[Path, ...]) -> None:
    """Delete the oldest checkpoints beyond ``keep_last``; never one of ``keep`` (just saved, resumed from)."""
    keep_real = {p.resolve() for p in keep}
    ckpts = [p for _, p in list_checkpoints(run)]
    for old in ckpts[: max(0, len(ckpts) - keep_last)]:
        if old.resolve() not in keep_real:
            # renamed out of the checkpoints first: a kill while deleting leaves a .tmp- folder (resume ignores it,
            # the next attempt removes it), never a half checkpoint under a checkpoint's name that stays for good
            doomed = old.with_name(TMP_PREFIX + old.name)
            try:
                os.replace(old, doomed)
            except OSError:
                doomed = old
            shutil.rmtree(doomed, ignore_errors=True)


def save_checkpoint(
    accelerator,
    run: Run,
    state: TrainState,
    meta: dict[str, Any],
    keep_last: int,
    scheduler_state: dict[str, Any] | None = None,
    protect: Path | None = None,
    tensors: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Collective: call on every rank. Returns the final checkpoint path.

    ``scheduler_state`` goes into ``progress.json`` as JSON (never a pickle);
    ``protect`` (the checkpoint this run resumed from) is never deleted by retention;
    ``tensors``: more files, ``{file name: {key: tensor}}``, written as safetensors by the main
    process (``--ema``'s ``ema.safetensors``; ``checkpoint.safe_load`` must know each name).
    A full disk gives one line and leaves the previous checkpoint as it was.
    """
    run = RunDir.of(run)
    root, name = run.checkpoints, checkpoint_name(state.global_step)
    tmp, final = root / f"{TMP_PREFIX}{name}", root / name
    previous = latest_checkpoint(run)
    needed = tree_size(previous) if previous else None
    try:
        with writing(final, "checkpoint", needed):
            if accelerator.is_main_process:
                root.mkdir(parents=True, exist_ok=True)
                for stale in root.glob(f"{TMP_PREFIX}step_*"):  # leftovers of a killed save (only ours)
                    if is_own_checkpoint_name(stale.name[len(TMP_PREFIX) :]):
                        shutil.rmtree(stale, ignore_errors=True)
                tmp.mkdir()
            accelerator.wait_for_everyone()
            accelerator.save_state(str(tmp), safe_serialization=True)
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                _write_tensors(tmp, tensors or {})
                progress = {"state": state.to_dict(), "scheduler": scheduler_state, **meta}
                write_json_atomic(tmp / PROGRESS_FILE, progress, "checkpoint")
                with WRITE_GUARD:
                    if final.exists():
                        shutil.rmtree(final)
                    os.replace(tmp, final)
    except UserError as exc:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = f"; the previous checkpoint {previous} is intact" if previous else ""
        raise UserError(f"{exc}{kept}") from None
    if accelerator.is_main_process:
        _retire_old(run, keep_last, tuple(p for p in (final, protect) if p is not None))
    accelerator.wait_for_everyone()
    return final


def _write_tensors(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    from safetensors.torch import save_file

    for name, tensors in files.items():
        # copies: tensors that share storage (tied weights) cannot be saved as views of one another
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(folder / name))


def _written_world_size(path: Path, progress: dict[str, Any]) -> int:
    size = progress.get("resolved", {}).get("world_size") if isinstance(progress.get("resolved"), dict) else None
    if isinstance(size, int) and size >= 1:
        return size
    return len(list(path.glob(RNG_FILE.format("*")))) or 1


def _restore_scheduler(scheduler, path: Path, progress: dict[str, Any]) -> None:
    state = progress.get("scheduler")
    legacy = path / "custom_checkpoint_0.pkl"  # checkpoints of earlier versions; opened safely, never by accelerate
    if state is None and legacy.is_file():
        state = safe_torch_load(legacy)
    if state is None:
        raise CheckpointError(f"cannot resume from {path}: it holds no LR schedule state; start a new --output-dir")
    try:
        scheduler.load_state_dict(state)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CheckpointError(
            f"cannot resume from {path}: its LR schedule state is invalid ({type(exc).__name__}); resume from "
            "another checkpoint"
        ) from None


SCALER_FILE = "scaler.pt"
SHARDED_WEIGHTS = "pytorch_model_fsdp_*"  # torch.distributed.checkpoint folders of FSDP's SHARDED_STATE_DICT


@contextmanager
def _without_scaler(accelerator, active: bool):
    """fp16 resuming a checkpoint that has no ``scaler.pt``: accelerate would fail to open it, so load without."""
    scaler = accelerator.scaler
    if not active:
        yield
        return
    if hasattr(scaler, "_lazy_init_scale_growth_tracker") and getattr(scaler, "_scale", 1) is None:
        scaler._lazy_init_scale_growth_tracker(scaler._device)  # FSDP2's optimizer load steps the scaler
    accelerator.scaler = None
    try:
        yield
    finally:
        accelerator.scaler = scaler


def _check_setup_can_read(accelerator, path: Path, progress: dict[str, Any]) -> None:
    """FSDP's sharded checkpoints resume only under FSDP, and FSDP resumes only those."""
    from accelerate.utils import DistributedType

    sharded = any(p.is_dir() for p in path.glob(SHARDED_WEIGHTS))
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    written_by = progress.get("resolved", {}).get("distributed_type", "another setup")
    if sharded and not fsdp:
        raise CheckpointError(
            f"cannot resume from {path} on this setup ({accelerator.distributed_type.value}): it holds FSDP-sharded "
            "weights (SHARDED_STATE_DICT) that only an FSDP run reads; resume with an FSDP config "
            "(accelerate_configs/fsdp.yaml), or start from the run's full export in model/ or best/"
        )
    if fsdp and not sharded and (path / "model.safetensors").is_file():
        raise CheckpointError(
            f"cannot resume from {path} under FSDP: it was written by a {written_by} run (full weights, not FSDP "
            "shards); resume it with that setup's accelerate config, or train under FSDP in a new --output-dir"
        )


def load_checkpoint(
    accelerator, path: str | Path, scheduler=None, inexact_ok: bool = False, seed: int = 0
) -> tuple[TrainState, dict[str, Any], list[str]]:
    """Collective: check ``path`` (nothing in it may run code), restore the state, return the progress.

    Returns ``(state, progress, notes)``: ``notes`` say what will not resume exactly
    (ranks whose random state could not be restored, with ``inexact_ok``, or ranks
    the checkpoint never had).
    """
    path = Path(path)
    progress = read_progress(path)
    written = _written_world_size(path, progress)
    unusable = verify_checkpoint(path, written, inexact_ok)
    from safetensors import SafetensorError

    _check_setup_can_read(accelerator, path, progress)
    fresh_scaler = accelerator.scaler is not None and not (path / SCALER_FILE).is_file()
    try:
        try:
            with _without_scaler(accelerator, fresh_scaler):
                accelerator.load_state(str(path))
        except RuntimeError as exc:
            # Checkpoints of earlier versions hold the LR schedule as custom_checkpoint_0.pkl. accelerate checks
            # the count of such files against registered objects last, after everything else is loaded; nothing
            # is registered now (accelerate would unpickle it unsafely), so _restore_scheduler reads it safely.
            legacy = any(path.glob("custom_checkpoint_*.pkl")) and not accelerator._custom_objects
            if not (legacy and str(exc).startswith("Number of custom checkpoints")):
                raise
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        # a truncated/corrupt file (our load hook's CheckpointError for another model passes through)
        reason = " ".join(str(exc).split()).split(". ")[0][:200] or type(exc).__name__
        raise CheckpointError(
            f"cannot resume from {path}: a file in it is missing, truncated or corrupt "
            f"({type(exc).__name__}: {reason}); resume from an older checkpoint in {path.parent}, "
            "or start a new --output-dir"
        ) from exc
    if scheduler is not None:
        _restore_scheduler(scheduler, path, progress)
    state = TrainState.from_dict(progress["state"])
    notes = [
        f"rank {r}'s random state is not restored ({why}); it starts from a fresh seed"
        for r, why in sorted(unusable.items())
    ]
    if written < accelerator.num_processes:
        notes.append(
            f"the checkpoint was written by {written} process(es): ranks {written}..{accelerator.num_processes - 1} "
            "start from fresh seeds (weights, optimizer and data order are exact; dropout draws differ)"
        )
    if fresh_scaler:
        notes.append(
            "the checkpoint holds no fp16 loss scale (a bf16, fp32 or CPU run wrote it); the scaler starts "
            "from its initial scale, so the first steps may be skipped while it calibrates"
        )
    rank = accelerator.process_index
    if rank in unusable or rank >= written:
        from accelerate.utils import set_seed

        set_seed((seed + 1_000_003 * state.global_step + rank) % 2**32)  # deterministic, distinct per rank and step
    return state, progress, notes
