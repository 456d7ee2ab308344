"""Check a checkpoint folder before resume reads any of it: nothing in it may run code.

Resume goes through ``accelerator.load_state``, which unpickles the optimizer,
scaler, sampler and RNG files with ``torch.load(weights_only=True)`` but:

* loads every *registered custom object* (``custom_checkpoint_N.pkl``) with
  ``weights_only=False`` (accelerate 1.15, ``checkpointing.load_custom_state``):
  a pickled ``os.system`` call in that file runs on ``--resume``. Reported-upstream
  wording: "load_custom_state always unpickles with weights_only=False, so
  Accelerator.load_state executes arbitrary code from a shared checkpoint; it
  should default to weights_only=True like the other state files". Workaround
  used here: nothing is registered for checkpointing (the LR schedule's state is
  numbers, saved as JSON in ``progress.json``), and this module refuses a folder
  before accelerate opens it;
* swallows any error while restoring the RNG files (``except Exception``), so a
  missing, corrupt or malicious ``random_states_N.pkl`` silently makes the
  resume inexact;
* reads FSDP's sharded ``.metadata`` through ``torch.distributed.checkpoint``,
  which uses plain ``pickle.load``.

:func:`verify_checkpoint` therefore opens every file of the folder the safe way
first, refuses unknown files, and checks each rank's RNG state. Every refusal
is one line that names the file.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle  # only the restricted Unpickler below, whose find_class allows plain data classes
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

from accel_train.errors import CheckpointError

PROGRESS_FILE = "progress.json"

# Everything accelerate's save_state and this project write into a checkpoint folder.
_KNOWN_FILE = re.compile(
    r"^(progress\.json|model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|optimizer(_\d+)?\.bin"
    r"|scheduler(_\d+)?\.bin|sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin|scaler\.pt"
    r"|random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl|ema\.safetensors)$"  # ema: --ema (features.ema)
)
_PICKLED = (".bin", ".pkl", ".pt")
_SHARDED_DIR = re.compile(r"^(pytorch_model_fsdp_\d+|optimizer_\d+)$")  # torch.distributed.checkpoint folders
_SHARDED_FILE = re.compile(r"^(\.metadata|__\d+_\d+\.distcp)$")
RNG_FILE = "random_states_{}.pkl"
EMA_WEIGHTS = "ema.safetensors"  # --ema's averaged weights (accel_train.features.ema)
_RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")


class UnsafeCheckpointError(CheckpointError):
    """A file in the checkpoint would run code if unpickled: always refused."""


def _refuse(path: Path, why: str, error: type[CheckpointError] = CheckpointError) -> CheckpointError:
    return error(
        f"refused to resume from {path.parent}: {path.name} {why}; resume from another checkpoint in "
        f"{path.parent.parent}, or start a new --output-dir"
    )


def safe_torch_load(path: str | Path) -> Any:
    """``torch.load`` that never runs code: tensors, numbers, containers and numpy arrays only.

    The numpy entries are the ones accelerate allows for its RNG files. Zip files
    are memory-mapped, so checking a large optimizer file reads little of it.
    """
    return _weights_only_load(path, mmap=zipfile.is_zipfile(path))


def _safe_load_bytes(blob: bytes) -> Any:
    return _weights_only_load(io.BytesIO(blob), mmap=False)


def _weights_only_load(source: Any, mmap: bool) -> Any:
    import torch
    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    with warnings.catch_warnings(), torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)


_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1", "EXT2", "EXT4"}


def _pickle_bytes(source: Path | bytes) -> bytes:
    if isinstance(source, bytes):
        return source
    if zipfile.is_zipfile(source):  # torch's format: the pickle is <archive>/data.pkl
        with zipfile.ZipFile(source) as archive:
            member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            return archive.read(member) if member else b""
    return Path(source).read_bytes()


def _needs_code(exc: BaseException, source: Path | bytes | None = None) -> bool:
    """Whether torch's weights_only refusal is about code (a global, a reduce) rather than damaged bytes.

    torch's message does not always say (a protocol-4 pickle of ``os.system`` reads as "Unsupported
    operand"), so the pickle itself is scanned: a stream that parses and calls or builds objects needs code.
    """
    if re.search(r"GLOBAL|global|Unsupported class", str(exc)):
        return True
    if source is None:
        return False
    import pickletools

    try:
        return any(op.name in _CODE_OPS for op, _, _ in pickletools.genops(_pickle_bytes(source)))
    except Exception:  # not a pickle stream at all: damaged
        return False


def _load_or_refuse(path: Path) -> Any:
    try:
        return safe_torch_load(path)
    except pickle.UnpicklingError as exc:
        if not _needs_code(exc, path):  # bytes that are no pickle at all: damaged, not malicious
            raise _refuse(path, f"is truncated or corrupt ({_first_line(exc)})") from None
        found = re.search(r"(?:GLOBAL|global|class)[:\s]+([\w.]+)", str(exc))
        names = f" (it references {found.group(1)})" if found else ""
        why = (
            f"would need to run code to load{names}; checkpoints written by accel_train hold only tensors and "
            "numbers, so this file was modified or comes from elsewhere"
        )
        raise _refuse(path, why, UnsafeCheckpointError) from None
    except Exception as exc:  # truncated zip, bad header, wrong format
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise _refuse(path, f"is truncated or corrupt ({type(exc).__name__}: {reason})") from None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and "Weights only load failed" not in ln]
    return (lines[0] if lines else type(exc).__name__)[:120]


class _MetadataUnpickler(pickle.Unpickler):
    """Allows the plain data classes that ``torch.distributed.checkpoint`` metadata is made of."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        obj = None
        if module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"):
            obj = super().find_class(module, name)
            plain = isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
            obj = obj if plain or name == "_MEM_FORMAT_ENCODING" else None
        elif module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            obj = getattr(torch, name)
        elif (module, name) in {
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"),
        }:
            obj = super().find_class(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return obj


def check_sharded_metadata(path: Path) -> Any:
    """Refuse a ``.metadata`` that holds anything but checkpoint metadata (torch reads it with pickle.load)."""
    try:
        return _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as exc:
        raise _refuse(path, f"would need to run code to load ({exc})", UnsafeCheckpointError) from None
    except Exception as exc:
        raise _refuse(path, f"is truncated or corrupt ({type(exc).__name__})") from None


def _check_sharded_bytes(folder: Path, metadata: Any) -> None:
    """Non-tensor entries of a sharded checkpoint (optimizer hyperparameters, ...) are pickles that torch's
    ``DefaultLoadPlanner.load_bytes`` reads with ``weights_only=False``: open each one safely first."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise _refuse(folder / ".metadata", "is not torch.distributed.checkpoint metadata")
    for index, info in storage.items():
        if not isinstance(entries.get(getattr(index, "fqn", None)), BytesStorageMetadata):
            continue  # tensors are read as raw storage
        shard = folder / str(getattr(info, "relative_path", ""))
        if getattr(info, "transform_descriptors", None) or not _SHARDED_FILE.match(shard.name):
            raise _refuse(shard, "holds an entry accel_train cannot check (stored with transforms)")
        with open(shard, "rb") as fh:
            fh.seek(int(info.offset))
            blob = fh.read(int(info.length))
        try:
            _safe_load_bytes(blob)
        except pickle.UnpicklingError as exc:
            if _needs_code(exc, blob):
                why = f"would need to run code to load entry {index.fqn!r}"
                raise _refuse(shard, why, UnsafeCheckpointError) from None
            raise _refuse(shard, f"is truncated or corrupt (entry {index.fqn!r})") from None
        except Exception as exc:
            raise _refuse(shard, f"is truncated or corrupt (entry {index.fqn!r}: {type(exc).__name__})") from None


def _check_sharded_dir(folder: Path) -> None:
    for entry in sorted(folder.iterdir()):
        if not (entry.is_file() and _SHARDED_FILE.match(entry.name)):
            raise _refuse(entry, "is not part of a sharded checkpoint (only .metadata and __N_M.distcp are)")
    metadata_file = folder / ".metadata"
    if not metadata_file.is_file():
        raise _refuse(metadata_file, "is missing")
    _check_sharded_bytes(folder, check_sharded_metadata(metadata_file))


def _check_safetensors(path: Path) -> None:
    """A safetensors file runs no code; check that its header and every tensor's extent are readable."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                handle.get_slice(key).get_shape()
    except Exception as exc:
        raise _refuse(path, f"is truncated or corrupt ({type(exc).__name__})") from None


def _rng_problem(path: Path) -> str | None:
    """Why ``path`` cannot restore a rank's random state (None: it can). Code-carrying files raise."""
    import torch

    if not path.is_file():
        return f"{path.name} is missing"
    try:
        state = _load_or_refuse(path)
    except UnsafeCheckpointError:
        raise
    except CheckpointError:
        return f"{path.name} is truncated or corrupt"
    if not (isinstance(state, dict) and all(k in state for k in _RNG_KEYS)):
        return f"{path.name} is not an RNG state saved by accelerate"
    seed = state["torch_manual_seed"]
    if not (isinstance(seed, torch.Tensor) and seed.dtype == torch.uint8):
        return f"{path.name} holds an invalid torch RNG state"
    return None


def verify_checkpoint(path: str | Path, written_world_size: int, inexact_ok: bool = False) -> dict[int, str]:
    """Open every file of checkpoint ``path`` safely; raise one :class:`CheckpointError` line on the first problem.

    ``written_world_size``: how many ranks wrote it, i.e. which ``random_states_N.pkl``
    must be there. With ``inexact_ok`` a missing or unusable RNG file is not an
    error; the returned ``{rank: reason}`` says which ranks' random state cannot be restored.
    """
    folder = Path(path)
    notes: dict[int, str] = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and _SHARDED_DIR.match(entry.name):
            _check_sharded_dir(entry)
            continue
        if not entry.is_file() or not _KNOWN_FILE.match(entry.name):
            kind = "folder" if entry.is_dir() else "file"
            raise _refuse(entry, f"is an unexpected {kind} (not something accelerate or accel_train writes)")
        if entry.name == EMA_WEIGHTS:
            _check_safetensors(entry)
        if entry.suffix not in _PICKLED or entry.name.startswith("random_states_"):
            continue
        _load_or_refuse(entry)
    for rank in range(written_world_size):
        problem = _rng_problem(folder / RNG_FILE.format(rank))
        if problem and not inexact_ok:
            raise CheckpointError(
                f"cannot resume exactly from {folder}: {problem} (rank {rank}'s random state); resume from another "
                f"checkpoint in {folder.parent} or start a new --output-dir, or pass --resume-inexact to continue "
                f"with rank {rank} freshly seeded (dropout and other random draws differ from an uninterrupted run)"
            )
        if problem:
            notes[rank] = problem
    return notes
