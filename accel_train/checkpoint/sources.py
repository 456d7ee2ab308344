"""Read, clean, load, export and inspect model weights from any of the usual places.

Sources that are understood (see :func:`read_state_dict`):

* our exports: ``DIR/model.safetensors`` + ``DIR/config.json``;
* accelerate ``save_state`` directories (``model.safetensors`` or ``pytorch_model.bin``,
  next to ``optimizer.bin``, ``random_states_*.pkl`` ...) and our checkpoint
  directories (the same plus ``progress.json`` whose ``model_config`` describes the model);
* ``.pt``/``.pth``/``.pkl``/``.bin``/``.ckpt`` files holding a state dict, possibly wrapped
  in ``{"epoch": 3, "state_dict": ...}``-style dicts;
* keys prefixed by ``module.`` (DataParallel/DDP) and/or ``_orig_mod.`` (torch.compile).

Safety: pickled files are only ever opened with
``torch.load(path, map_location="cpu", weights_only=True)``. A file that needs
arbitrary code to unpickle (a pickled ``nn.Module``, a malicious ``__reduce__``) is
refused with a :class:`CheckpointError` that explains how to convert it from
trusted code. Nothing is imported or executed from the checkpoint path.
"""

from __future__ import annotations

import json
import os
import pickle  # only for pickle.UnpicklingError: nothing is ever unpickled with it
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from accel_train.checkpoint.keys import _mixed_prefixes, _strip_uniform
from accel_train.errors import CheckpointError
from accel_train.limits import check_regular_file

# Entries of a wrapper dict that may hold the model's state dict, most preferred first.
_STATE_DICT_KEYS = (
    "state_dict",
    "model_state_dict",
    "model",
    "module",
    "net",
    "network",
    "model_state",
    "weights",
    "params",
    "ema",
    "model_ema",
    "ema_state_dict",
    "state_dict_ema",
)


# Entries that hold other state dicts of tensors (optimizer moments etc.): never the model.
_SKIP_KEYS = ("optimizer", "optim", "scheduler", "lr_scheduler", "scaler", "grad_scaler", "optimizer_state_dict")


_MAX_DEPTH = 4


# Weight files looked for in a directory, in order.
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.pt",
    "model.pth",
    "pytorch_model.pt",
)


# Files of an accelerate save_state directory that are not model weights.
_NOT_WEIGHTS = ("optimizer", "scheduler", "scaler", "random_states", "custom_checkpoint", "sampler")


_PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".bin", ".ckpt", ".tar")


# Buffers that are not learned parameters (for the parameter count of inspect_checkpoint).
_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_state_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) for k in obj)
        and all(isinstance(v, Tensor) for v in obj.values())
    )


def _find_state_dict(obj: Any) -> tuple[dict[str, Tensor], list[str], list[str]]:
    """Find the model's state dict in a loaded object: (state dict, path of keys, other candidates)."""
    if _is_state_dict(obj):
        return dict(obj), [], []
    candidates: list[tuple[list[str], Mapping]] = []

    def walk(node: Any, path: list[str]) -> None:
        if len(path) >= _MAX_DEPTH or not isinstance(node, Mapping):
            return
        for key, value in node.items():
            if not isinstance(key, str) or key.lower() in _SKIP_KEYS:
                continue
            if _is_state_dict(value):
                candidates.append((path + [key], value))
            else:
                walk(value, path + [key])

    walk(obj, [])
    if not candidates:
        if isinstance(obj, Mapping):
            keys = ", ".join(repr(k) for k in list(obj)[:8])
            what = f"a dict with keys {keys}" if obj else "an empty dict"
        else:
            what = f"a {type(obj).__name__}"
        raise CheckpointError(
            f"found no state dict (a dict of name -> tensor) in the file: it holds {what}; "
            "save the model with torch.save(model.state_dict(), path)"
        )

    def rank(item: tuple[list[str], Mapping]) -> tuple[int, int, int]:
        path, sd = item
        name = path[-1].lower()
        preference = _STATE_DICT_KEYS.index(name) if name in _STATE_DICT_KEYS else len(_STATE_DICT_KEYS)
        return preference, len(path), -len(sd)

    candidates.sort(key=rank)
    path, sd = candidates[0]
    others = [".".join(p) for p, _ in candidates[1:]]
    return dict(sd), path, others


# --------------------------------------------------------------------------- files


def _sniff_format(path: Path) -> str:
    check_regular_file(path, "weights", CheckpointError)  # a FIFO would block the read below forever
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {_short(e)}") from e
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): it looks truncated or corrupt; re-export or re-copy it")
    if head[:4] == b"PK\x03\x04":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < size:
        return "safetensors"
    if path.suffix == ".safetensors":
        return "safetensors"
    if head[:1] == b"\x80":
        return "torch-legacy"
    return "torch"


def _unsafe_pickle_error(path: Path, exc: BaseException) -> CheckpointError:
    message = str(exc)
    match = re.search(r"Unsupported (?:global|class)[:\s]+(?:GLOBAL\s+)?([\w.]+)", message, re.IGNORECASE)
    needs = f" (it references {match.group(1)})" if match else ""
    return CheckpointError(
        f"refused to load {path}: the file needs arbitrary code to load{needs}, e.g. a pickled nn.Module "
        "or a malicious object, and only plain tensors are loaded; if you TRUST its origin, convert it in "
        f'trusted code: torch.save(torch.load("{path}", weights_only=False).state_dict(), "clean.pt") '
        "(use the dict entry holding the weights if it is not a module), then load clean.pt"
    )


def _unpickling_reason(exc: BaseException) -> str:
    """The informative part of torch's weights_only error (without its generic preamble and doc link)."""
    boilerplate = ("Weights only load failed", "In PyTorch", "Please file an issue", "Check the documentation")
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(boilerplate)]
    return _short(Exception(" ".join(lines))) if lines else _short(exc)


def _load_pickle(path: Path) -> Any:
    try:
        with warnings.catch_warnings():  # "Detected pickle protocol 4": the load fails or succeeds on its own
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if re.search(r"Unsupported (global|class)|GLOBAL|reduce|not an allowed", str(e)):
            raise _unsafe_pickle_error(path, e) from None
        raise CheckpointError(
            f"refused to load {path}: it is either corrupt/truncated or needs arbitrary code to load "
            f"({_unpickling_reason(e)}); re-export it, or convert it from trusted code with "
            f'torch.save(torch.load("{path}", weights_only=False).state_dict(), "clean.pt")'
        ) from None
    except (EOFError, RuntimeError, ValueError, KeyError, IndexError, TypeError, AttributeError, OSError) as e:
        raise CheckpointError(
            f"cannot load {path}: it looks truncated or corrupt, or is not a PyTorch weights file "
            f"({_short(e)}); re-export or re-copy it"
        ) from None


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"cannot load {path}: it looks truncated or corrupt, or is not a safetensors file "
            f"({_short(e)}); re-export or re-copy it"
        ) from None


def _load_file(path: Path) -> tuple[Any, str]:
    fmt = _sniff_format(path)
    if fmt == "safetensors":
        return _load_safetensors(path), fmt
    return _load_pickle(path), fmt


def _load_sharded(index: Path) -> tuple[dict[str, Tensor], str, list[Path]]:
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no 'weight_map': it looks corrupt; re-export the model")
    shards = [index.parent / name for name in dict.fromkeys(weight_map.values())]
    merged: dict[str, Tensor] = {}
    fmt = "safetensors"
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"shard {shard.name} listed in {index} is missing; copy the whole directory")
        obj, fmt = _load_file(shard)
        sd, _, _ = _find_state_dict(obj)
        merged.update(sd)
    return merged, fmt, shards


def _read_json(path: Path) -> Any:
    check_regular_file(path, "JSON", CheckpointError)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {_short(e)}; fix or delete the file") from None


def _model_config_in(directory: Path) -> tuple[dict | None, str | None]:
    """Model config from ``progress.json["model_config"]`` or an export's ``config.json``."""
    progress = directory / "progress.json"
    if progress.is_file():
        data = _read_json(progress)
        if isinstance(data, dict) and isinstance(data.get("model_config"), dict):
            return dict(data["model_config"]), str(progress)
    config = directory / "config.json"
    if config.is_file():
        data = _read_json(config)
        if isinstance(data, dict) and ("model" in data or "model_name" in data):
            return dict(data), str(config)
    return None, None


def _weights_file_in(directory: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    files = sorted(p for p in directory.iterdir() if p.is_file())
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    if len(safetensors) == 1:
        return safetensors[0]
    pickles = [p for p in files if p.suffix in (".pt", ".pth", ".ckpt") and not p.name.lower().startswith(_NOT_WEIGHTS)]
    if len(pickles) == 1 and not safetensors:
        return pickles[0]
    looked = ", ".join(_WEIGHT_FILES)
    hint = ""
    if len(safetensors) + len(pickles) > 1:
        hint = f"; several candidates ({', '.join(p.name for p in safetensors + pickles)}): pass one file"
    else:
        fsdp = [p.name for p in directory.iterdir() if p.is_dir() and "fsdp" in p.name]
        subdirs = sorted(
            p.name for p in directory.iterdir() if p.is_dir() and any((p / n).is_file() for n in _WEIGHT_FILES)
        )
        if fsdp:
            hint = f"; {fsdp[0]} is a sharded FSDP checkpoint: merge it first with `accelerate merge-weights`"
        elif subdirs:
            hint = f"; these subdirectories hold weights: {', '.join(subdirs[:5])}"
    raise CheckpointError(f"no weights file in {directory}: looked for {looked}, or a single *.safetensors{hint}")


def _directory_kind(directory: Path, config_source: str | None) -> str:
    if (directory / "progress.json").is_file():
        return "checkpoint"
    names = [p.name for p in directory.iterdir()]
    if any(n.startswith(("optimizer", "random_states_", "scheduler")) for n in names):
        return "accelerate"
    if config_source is not None:
        return "export"
    return "directory"


def _resolve(source: str | os.PathLike) -> Path:
    path = Path(source).expanduser()
    if not path.exists():
        raise CheckpointError(f"weights not found: {source} does not exist; pass a weights file or directory")
    path = path.resolve()
    if path.is_file() and path.name in ("config.json", "progress.json"):
        path = path.parent
    return path


def _read_raw(source: str | os.PathLike) -> tuple[dict[str, Tensor], dict]:
    """Load the state dict without stripping prefixes, plus metadata."""
    path = _resolve(source)
    if path.is_dir():
        directory: Path | None = path
        weights = _weights_file_in(path)
    else:
        weights = path
        # a standard weights file inside an export or checkpoint directory: use that directory's config
        directory = path.parent if path.name in _WEIGHT_FILES else None
    if weights.name.endswith(".index.json"):
        sd, fmt, files = _load_sharded(weights)
        entry: list[str] = []
        others: list[str] = []
    else:
        obj, fmt = _load_file(weights)
        try:
            sd, entry, others = _find_state_dict(obj)
        except CheckpointError as e:
            raise CheckpointError(f"{weights}: {e}") from None
        files = [weights]
    model_config, config_source = _model_config_in(directory) if directory is not None else (None, None)
    kind = _directory_kind(directory, config_source) if directory is not None else "file"
    if kind == "directory" and not path.is_dir():
        kind = "file"
    meta = {
        "format": fmt,
        "kind": kind,
        "path": str(weights),
        "files": [str(f) for f in files],
        "entry": ".".join(entry) or None,
        "other_entries": others,
        "prefixes": [],
        "mixed_prefixes": [],
        "model_config": model_config,
        "config_path": config_source,
    }
    return sd, meta


# --------------------------------------------------------------------------- public API


def read_state_dict(source: str | os.PathLike) -> tuple[dict[str, Tensor], dict]:
    """Load a clean CPU state dict (wrapper prefixes stripped) and metadata from a file or directory.

    Metadata keys: ``format`` (``safetensors``/``torch``/``torch-legacy``), ``kind``
    (``export``/``checkpoint``/``accelerate``/``directory``/``file``), ``path`` (the
    weights file), ``files``, ``entry`` (wrapper key the state dict came from, e.g.
    ``state_dict``), ``prefixes`` (stripped), ``mixed_prefixes`` (found on only some
    keys, left alone), ``model_config`` (dict or None) and ``config_path``.
    """
    raw, meta = _read_raw(source)
    sd, prefixes = _strip_uniform(raw)
    meta["prefixes"] = prefixes
    meta["mixed_prefixes"] = _mixed_prefixes(sd)
    return sd, meta


def inspect_checkpoint(source: str | os.PathLike) -> dict:
    """Describe a weights source without building a model.

    Keys: ``format``, ``kind``, ``path``, ``files``, ``entry``, ``prefixes``,
    ``mixed_prefixes``, ``num_tensors``, ``num_parameters`` (all elements except
    BatchNorm running statistics), ``num_elements``, ``size_bytes`` (weight files
    on disk), ``tensors`` (list of ``{name, shape, dtype}``), ``model_config``.
    """
    sd, meta = read_state_dict(source)
    tensors = [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in sd.items()]
    return {
        "format": meta["format"],
        "kind": meta["kind"],
        "path": meta["path"],
        "files": meta["files"],
        "entry": meta["entry"],
        "prefixes": meta["prefixes"],
        "mixed_prefixes": meta["mixed_prefixes"],
        "num_tensors": len(sd),
        "num_parameters": sum(v.numel() for k, v in sd.items() if not k.endswith(_BUFFER_SUFFIXES)),
        "num_elements": sum(v.numel() for v in sd.values()),
        "size_bytes": sum(Path(f).stat().st_size for f in meta["files"]),
        "tensors": tensors,
        "model_config": meta["model_config"],
        "config_path": meta["config_path"],
    }
