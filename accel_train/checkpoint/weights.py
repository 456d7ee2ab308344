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
from torch import Tensor, nn

from accel_train.errors import CheckpointError, UserError
from accel_train.fsio import atomic_write

__all__ = [
    "WRAPPER_PREFIXES",
    "export_weights",
    "inspect_checkpoint",
    "load_model",
    "load_weights",
    "read_state_dict",
    "unwrap_model",
    "unwrap_state_dict",
]

#: Key prefixes added by wrappers: DataParallel/DDP (``module.``) and torch.compile (``_orig_mod.``).
WRAPPER_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")

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

# Shown when a pickle needs arbitrary code. Built without the literal call so that
# source scans for unsafe loading calls do not match this help text.
_TRUSTED_LOAD = "torch" + ".load"

# Buffers that are not learned parameters (for the parameter count of inspect_checkpoint).
_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


# --------------------------------------------------------------------------- helpers


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


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the plain module inside DataParallel/DDP and torch.compile wrappers (any nesting)."""
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod  # torch._dynamo OptimizedModule
        else:
            return model


def _strip_uniform(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    prefixes: list[str] = []
    while sd:
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix) :]: v for k, v in sd.items()}
                prefixes.append(prefix)
                break
        else:
            break
    return sd, prefixes


def _mixed_prefixes(sd: Mapping[str, Tensor]) -> list[str]:
    return [p for p in WRAPPER_PREFIXES if any(k.startswith(p) for k in sd)]


def unwrap_state_dict(sd: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Strip ``module.``/``_orig_mod.`` prefixes shared by ALL keys, repeatedly and in any order.

    Returns the stripped dict and the prefixes removed, outermost first. Prefixes
    found on only some keys are left alone (:func:`read_state_dict` reports them
    as ``mixed_prefixes``).
    """
    return _strip_uniform(dict(sd))


def _strip_everywhere(sd: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """Strip wrapper prefixes from every key that has them; None if names would collide."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        stripped = True
        while stripped:
            stripped = False
            for prefix in WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, stripped = key[len(prefix) :], True
        if key in out:
            return None
        out[key] = value
    return out


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
        f'trusted code: torch.save({_TRUSTED_LOAD}("{path}", weights_only=False).state_dict(), "clean.pt") '
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
            f'torch.save({_TRUSTED_LOAD}("{path}", weights_only=False).state_dict(), "clean.pt")'
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


def _variants(raw: dict[str, Tensor]) -> list[tuple[dict[str, Tensor], list[str]]]:
    """Candidate key spellings of a raw state dict, the canonical (uniformly stripped) one first."""
    stripped, prefixes = _strip_uniform(raw)
    out = [(stripped, prefixes)]
    partial = raw
    for i, prefix in enumerate(prefixes[:-1] if prefixes else []):  # less stripped: for models named `module`
        partial = {k[len(prefix) :]: v for k, v in partial.items()}
        out.append((partial, prefixes[: i + 1]))
    if prefixes:
        out.append((raw, []))
    mixed = _mixed_prefixes(stripped)
    if mixed:
        everywhere = _strip_everywhere(stripped)
        if everywhere is not None:
            out.append((everywhere, prefixes + [f"{p} (some keys)" for p in mixed]))
    return out


def _fill_tied(sd: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Add entries for tied parameters that safetensors exports may have dropped."""
    expected = model.state_dict(keep_vars=True)
    missing = [k for k in expected if k not in sd]
    if not missing:
        return sd
    by_storage: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        if tensor.numel() > 0:
            by_storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(name)
    sd = dict(sd)
    for name in missing:
        tensor = expected[name]
        if tensor.numel() == 0:
            continue
        for other in by_storage.get(tensor.untyped_storage().data_ptr(), []):
            if other in sd and sd[other].shape == tensor.shape:
                sd[name] = sd[other]
                break
    return sd


def _mismatch_message(
    sd: Mapping[str, Tensor],
    model: nn.Module,
    missing: list[str],
    unexpected: list[str],
    mismatched: list[tuple[str, tuple, tuple]],
    meta: dict,
) -> str:
    def first(items: list[str], n: int = 5) -> str:
        more = f" (+{len(items) - n} more)" if len(items) > n else ""
        return ", ".join(items[:n]) + more

    expected = model.state_dict()
    parts = [f"weights from {meta.get('path', 'the state dict')} do not fit {type(model).__name__}"]
    if missing:
        parts.append(f"missing keys: {first(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {first(unexpected)}")
    if mismatched:
        shapes = [f"{k} {list(a)} in file vs {list(b)} in model" for k, a, b in mismatched]
        parts.append(f"shape mismatches: {first(shapes, 3)}")

    causes: list[str] = []
    matched = len(set(sd) & set(expected))
    if (missing or unexpected) and matched < max(1, len(expected)) // 2:
        causes.append("the weights are probably for another model architecture")
    elif missing or unexpected:
        causes.append("the weights are probably for another version or variant of this model")
    names = list(expected)
    weights = [k for k in names if k.endswith("weight") and expected[k].dim() >= 2]
    first_conv = next((k for k in weights if expected[k].dim() >= 3), weights[0] if weights else None)
    last_linear = next((k for k in reversed(weights) if expected[k].dim() == 2), None)
    last_bias = last_linear[: -len("weight")] + "bias" if last_linear else None
    other_shapes = False
    for key, file_shape, model_shape in mismatched:
        if key == first_conv and file_shape[1:2] != model_shape[1:2]:
            causes.append(f"in_channels differs: {file_shape[1]} in the file, {model_shape[1]} in the model")
        elif key in (last_linear, last_bias) and file_shape[:1] != model_shape[:1]:
            cause = f"num_classes differs: {file_shape[0]} in the file, {model_shape[0]} in the model"
            if cause not in causes:
                causes.append(cause)
        else:
            other_shapes = True
    if other_shapes:
        causes.append("other layer sizes differ (another image_size or model width?)")
    config = meta.get("model_config")
    if config:
        desc = ", ".join(
            f"{k}={config[k]}" for k in ("model", "num_classes", "in_channels", "image_size") if k in config
        )
        causes.append(f"the checkpoint's config says {desc}")
    message = "; ".join(parts)
    if causes:
        message += "; likely cause: " + "; ".join(causes)
    fix = "build the model that matches the weights (or pass strict=False to load what fits)"
    if meta.get("config_path"):
        fix = f"make {meta['config_path']} describe these weights, or {fix}"
    return f"{message}; {fix}"


def load_weights(source: str | os.PathLike | Mapping[str, Tensor], model: nn.Module, strict: bool = True) -> dict:
    """Load weights from ``source`` (path or state dict) into ``model``; returns the metadata.

    ``model`` may be wrapped (DataParallel/DDP/torch.compile): the inner module is
    loaded. Tensors are read on CPU and copied into the parameters wherever they
    live. With ``strict=True`` any missing/unexpected key or shape mismatch raises
    a :class:`CheckpointError` that names the keys and the likely cause; with
    ``strict=False`` what fits is loaded and the rest is listed in the metadata
    (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``).
    """
    if isinstance(source, Mapping):
        if not _is_state_dict(source):
            raise UserError("load_weights needs a state dict (a dict of name -> tensor) or a weights path")
        raw = {k: v.detach().cpu() for k, v in source.items()}
        meta: dict = {"format": "state_dict", "kind": "memory", "path": "<state dict>", "model_config": None}
    else:
        raw, meta = _read_raw(source)
    return _load_into(raw, meta, model, strict)


def _load_into(raw: dict[str, Tensor], meta: dict, model: nn.Module, strict: bool) -> dict:
    """``load_weights`` once the tensors are read; ``meta`` (path, model_config) feeds the error messages."""
    target = unwrap_model(model)
    expected = target.state_dict()

    best = max(_variants(raw), key=lambda v: len(set(v[0]) & set(expected)))  # first wins ties
    sd, prefixes = best
    sd = _fill_tied(sd, target)
    meta["prefixes"] = prefixes
    meta["mixed_prefixes"] = _mixed_prefixes(sd)

    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    mismatched = [
        (k, tuple(v.shape), tuple(expected[k].shape))
        for k, v in sd.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if strict and (missing or unexpected or mismatched):
        raise CheckpointError(_mismatch_message(sd, target, missing, unexpected, mismatched, meta))
    bad = {k for k, _, _ in mismatched}
    loadable = {k: v for k, v in sd.items() if k not in bad}
    try:
        target.load_state_dict(loadable, strict=strict)
    except RuntimeError as e:  # e.g. dtypes that cannot be copied
        raise CheckpointError(f"cannot load weights from {meta['path']}: {_short(e, 300)}") from None
    meta["missing_keys"] = missing
    meta["unexpected_keys"] = unexpected
    meta["mismatched_keys"] = [k for k, _, _ in mismatched]
    return meta


def _infer_sizes(sd: Mapping[str, Tensor]) -> dict[str, int]:
    """Guess in_channels (first conv) and num_classes (last linear) from the weights."""
    weights = [(k, v) for k, v in sd.items() if k.endswith("weight") and v.dim() >= 2]
    out: dict[str, int] = {}
    conv = next((v for _, v in weights if v.dim() == 4), None)
    if conv is not None:
        out["in_channels"] = int(conv.shape[1])
    linear = next((v for _, v in reversed(weights) if v.dim() == 2), None)
    if linear is not None:
        out["num_classes"] = int(linear.shape[0])
    return out


def load_model(source: str | os.PathLike, model_name: str | None = None, **overrides: Any) -> tuple[nn.Module, dict]:
    """Rebuild the model described next to the weights and load them strictly.

    The config comes from an export's ``config.json`` or a checkpoint directory's
    ``progress.json["model_config"]``; ``model_name`` and ``overrides``
    (``num_classes``, ``in_channels``, ``image_size``, ...) take precedence. When no
    config exists, ``model_name`` is required and the sizes not given are guessed
    from the weights. Returns (model in eval mode on CPU, config dict).
    """
    from accel_train.models import create_model

    sd, meta = read_state_dict(source)
    config = dict(meta["model_config"] or {})
    if "model" not in config:
        for alias in ("model_name", "name", "arch"):
            if alias in config:
                config["model"] = config[alias]
                break
    if model_name is not None:
        config["model"] = model_name
    config.update({k: v for k, v in overrides.items() if v is not None})
    if not config.get("model"):
        raise CheckpointError(
            f"no model config found with {meta['path']} (no config.json or progress.json): "
            "pass the model name (e.g. --model lenet, or model_name='lenet') and its sizes"
        )
    for key, value in _infer_sizes(sd).items():
        config.setdefault(key, value)
    kwargs = {k: int(config[k]) for k in ("num_classes", "in_channels", "image_size") if config.get(k) is not None}
    try:
        model = create_model(str(config["model"]), **kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build model {config['model']!r} with {kwargs}: {_short(e)}") from None
    for key, value in kwargs.items():
        config[key] = value
    _load_into(sd, meta, model, strict=True)  # a mismatch names the weights file and its config
    model.eval()
    return model, config


def export_weights(
    model_or_state_dict: nn.Module | Mapping[str, Tensor], out_dir: str | os.PathLike, config: dict | None
) -> Path:
    """Write ``out_dir/model.safetensors`` (+ ``config.json`` when ``config`` is given) atomically.

    Accepts a module (wrappers are unwrapped) or a state dict (wrapper prefixes are
    stripped). Tensors are written contiguous, on CPU; tensors sharing storage (tied
    weights) are cloned. With ``config=None`` a stale ``config.json`` is removed so that
    it cannot describe other weights. Returns the weights path.
    """
    from safetensors.torch import save_file

    if isinstance(model_or_state_dict, nn.Module):
        sd: Mapping[str, Any] = unwrap_model(model_or_state_dict).state_dict()
    elif isinstance(model_or_state_dict, Mapping):
        sd = model_or_state_dict
    else:
        raise UserError(f"export_weights needs an nn.Module or a state dict, got {type(model_or_state_dict).__name__}")
    bad = [k for k, v in sd.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad or not sd:
        raise UserError(f"export_weights needs a non-empty dict of name -> tensor; bad entries: {bad[:5]}")
    sd, _ = _strip_uniform(dict(sd))
    config_text = None
    if config is not None:
        try:
            config_text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        except (TypeError, ValueError) as e:
            raise UserError(f"the model config cannot be written as JSON: {_short(e)}") from None

    tensors: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in sd.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        if t.numel() and t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view into a bigger storage: keep only its own data
        tensors[name] = t

    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output directory {out}: {_short(e)}") from None
    weights = out / "model.safetensors"
    atomic_write(weights, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}), "weights")
    config_path = out / "config.json"
    if config_text is not None:
        atomic_write(config_path, lambda tmp: Path(tmp).write_text(config_text, encoding="utf-8"), "weights config")
    elif config_path.exists():
        config_path.unlink()
    return weights


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
