"""Load weights into a model (any source :mod:`accel_train.checkpoint.sources` understands) and export them.

The public API of the old single module is kept here: ``read_state_dict``, ``inspect_checkpoint`` and
``unwrap_*`` are re-exported from :mod:`~accel_train.checkpoint.sources` and :mod:`~accel_train.checkpoint.keys`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn

from accel_train.checkpoint.keys import (
    WRAPPER_PREFIXES,
    _mixed_prefixes,
    _strip_uniform,
    _variants,
    unwrap_model,
    unwrap_state_dict,
)
from accel_train.checkpoint.metadata import check_model_config
from accel_train.checkpoint.sources import (
    _is_state_dict,
    _read_raw,
    _short,
    inspect_checkpoint,
    read_state_dict,
)
from accel_train.errors import CheckpointError, UserError
from accel_train.fsio import atomic_write, write_text_atomic

__all__ = [
    "WRAPPER_PREFIXES",
    "LoadedModel",
    "export_weights",
    "inspect_checkpoint",
    "load_model",
    "load_weights",
    "read_state_dict",
    "saved_model_config",
    "user_code_allowed",
    "unwrap_model",
    "unwrap_state_dict",
]


# --------------------------------------------------------------------------- helpers


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

    matched = len(set(sd) & set(expected))
    causes: list[str] = []
    if (missing or unexpected) and matched < max(1, len(expected)) // 2:
        causes.append("the weights are probably for another model architecture")
    elif missing or unexpected:
        causes.append("the weights are probably for another version or variant of this model")
    causes += _shape_causes(expected, mismatched)
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


def _shape_causes(expected: Mapping[str, Tensor], mismatched: list[tuple[str, tuple, tuple]]) -> list[str]:
    """Name the constructor argument that explains each shape mismatch: in_channels, num_classes, or other sizes."""
    weights = [k for k in expected if k.endswith("weight") and expected[k].dim() >= 2]
    first_conv = next((k for k in weights if expected[k].dim() >= 3), weights[0] if weights else None)
    last_linear = next((k for k in reversed(weights) if expected[k].dim() == 2), None)
    last_bias = last_linear[: -len("weight")] + "bias" if last_linear else None
    causes: list[str] = []
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
    return causes


def load_weights(
    model: nn.Module, source: str | os.PathLike | Mapping[str, Tensor], strict: bool = True
) -> dict[str, Any]:
    """Load weights from ``source`` (a path or a state dict) into ``model``; returns the metadata of
    :func:`read_state_dict` (``path``, ``model_config``: the config saved with the weights, or None, ...).

    The order of torch's ``model.load_state_dict(sd)`` and accelerate's ``load_checkpoint_in_model(model, path)``.
    ``source`` is anything :func:`read_state_dict` reads (an export, a checkpoint directory, a ``.pt`` file...)
    or a state dict. ``model`` may be wrapped (DataParallel/DDP/torch.compile): the inner module is
    loaded. Tensors are read on CPU and copied into the parameters wherever they
    live. With ``strict=True`` any missing/unexpected key or shape mismatch raises
    a :class:`CheckpointError` that names the keys and the likely cause; with
    ``strict=False`` what fits is loaded and the rest is listed in the metadata
    (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``). The old order
    ``load_weights(source, model)`` still works, with a DeprecationWarning.
    """
    if isinstance(source, nn.Module) and not isinstance(model, nn.Module):
        warnings.warn(
            "load_weights(source, model) is deprecated: call load_weights(model, source), the order of torch's "
            "load_state_dict",
            DeprecationWarning,
            stacklevel=2,
        )
        model, source = source, model
    if not isinstance(model, nn.Module):
        raise UserError(
            f"load_weights needs an nn.Module first, got a {type(model).__name__}: load_weights(model, path)"
        )
    if isinstance(source, Mapping):
        if not _is_state_dict(source):
            raise UserError("load_weights needs a state dict (a dict of name -> tensor) or a weights path")
        raw = {k: v.detach().cpu() for k, v in source.items()}
        meta: dict = {"format": "state_dict", "kind": "memory", "path": "<state dict>", "model_config": None}
    elif isinstance(source, (str, os.PathLike)):
        raw, meta = _read_raw(source)
    else:
        raise UserError(
            f"load_weights(model, source) needs a weights path or a state dict as source, got a "
            f"{type(source).__name__}; for another module's weights pass other.state_dict()"
        )
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
    _refuse_integer_floats(sd, expected, meta)
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


def _refuse_integer_floats(sd: Mapping[str, Tensor], expected: Mapping[str, Tensor], meta: dict) -> None:
    """A tensor the model holds in floating point must come as floating point: ``load_state_dict`` would copy
    int8 (quantized) or bool values into it silently. Integer buffers (BatchNorm's ``num_batches_tracked``) stay."""
    for key, value in sd.items():
        want = expected.get(key)
        if want is not None and want.is_floating_point() and not value.is_floating_point():
            raise CheckpointError(
                f"{meta['path']}: tensor {key} is {str(value.dtype).removeprefix('torch.')} but the model holds it "
                f"as {str(want.dtype).removeprefix('torch.')}: quantized or corrupt weights cannot be loaded; "
                "export the floating-point weights (e.g. the run's model/ folder) and use those"
            )


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


#: Whether ``load_model`` may import the user code a config names (``--allow-import``); see :func:`user_code_allowed`.
_ALLOW_IMPORT: contextvars.ContextVar[bool] = contextvars.ContextVar("allow_import", default=False)


@contextlib.contextmanager
def user_code_allowed(allowed: bool = True) -> Iterator[None]:
    """Within this block, ``load_model`` may import the ``package.module:callable`` a config names.

    For programs that load models deep inside (``accel-evaluate --allow-import``).
    """
    token = _ALLOW_IMPORT.set(bool(allowed))
    try:
        yield
    finally:
        _ALLOW_IMPORT.reset(token)


def _check_rebuild(config: dict, model_name: str | None, allow_import: bool | None, where: str) -> None:
    """A config alone never imports code: user code needs the caller's explicit name or opt-in."""
    from accel_train.models import check_model_name, is_user_code
    from accel_train.models.user import is_instance_label, is_main_script, main_script_error, rebuild_instance_error

    spec = str(config["model"])
    try:
        check_model_name(spec)  # spelling only: nothing is imported
    except UserError as exc:
        raise CheckpointError(f"{where}: model {exc}") from None
    if is_instance_label(spec):
        raise rebuild_instance_error(f"{spec} (in {where})")
    if is_user_code(spec) and is_main_script(spec):
        raise main_script_error(f"{spec} (in {where})")
    if model_name is not None:
        return  # the caller named the model: building it is what was asked
    allowed = _ALLOW_IMPORT.get() if allow_import is None else allow_import
    if is_user_code(spec) and not allowed:
        raise UserError(
            f"{where} names your code {spec} as its model, and building it would import (run) that module; "
            f"pass --allow-import (allow_import=True) if you trust it, or name it yourself (model_name={spec!r})"
        )


def _resolved_config(
    meta: dict, model_name: str | None, given: dict[str, Any], sd: Mapping[str, Tensor] | None
) -> tuple[dict, str]:
    """(the saved config with ``model_name`` and ``given`` applied, where it came from); sizes missing from it
    are guessed from ``sd`` when given. Validated, one line per bad field; nothing is imported."""
    from accel_train.models import available_models

    config = dict(meta["model_config"] or {})
    if "model" not in config:
        for alias in ("model_name", "name", "arch"):
            if alias in config:
                config["model"] = config[alias]
                break
    if model_name is not None:
        config["model"] = model_name
    config.update(given)
    if not config.get("model"):
        raise CheckpointError(
            f"no model config found with {meta['path']} (no config.json or progress.json): "
            "pass the model name (e.g. --model lenet, or model_name='lenet') and its sizes"
        )
    for key, value in (_infer_sizes(sd) if sd is not None else {}).items():
        config.setdefault(key, value)
    where = meta["config_path"] or "the model config"
    if given:
        where += f" (with {', '.join(f'{k}={v!r}' for k, v in given.items())} from the arguments)"
    spec = isinstance(config["model"], str) and config["model"] not in available_models() and ":" in config["model"]
    # types, ranges, lengths: one line naming the file and the field (tv:, user code: checked by _check_rebuild)
    check_model_config({k: v for k, v in config.items() if k != "model"} if spec else config, where)
    return config, where


def saved_model_config(meta: dict, model_name: str | None = None, **overrides: Any) -> dict:
    """The model config saved with the weights (``meta`` from :func:`read_state_dict`), validated.

    ``model_name`` and the ``overrides`` that are not None take precedence, as in :func:`load_model`;
    no size is guessed, and nothing is imported or built (what ``convert_checkpoint.py`` copies).
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    return _resolved_config(meta, model_name, given, None)[0]


class LoadedModel(NamedTuple):
    """What :func:`load_model` returns: ``model, config = load_model(path)`` or ``load_model(path).model``."""

    model: nn.Module
    config: dict


def load_model(
    source: str | os.PathLike, model_name: str | None = None, *, allow_import: bool | None = None, **overrides: Any
) -> LoadedModel:
    """Rebuild the model described next to the weights and load them strictly.

    Returns ``LoadedModel(model, config)``, a named tuple: ``model`` in eval mode on CPU, and ``config``, the
    dict it was built from (model name, sizes, and what else was saved: mean, std, class_names...).
    The config comes from an export's ``config.json`` or a checkpoint directory's
    ``progress.json["model_config"]``; ``model_name`` and ``overrides``
    (``num_classes``, ``in_channels``, ``image_size``, ...) take precedence. When no
    config exists, ``model_name`` is required and the sizes not given are guessed
    from the weights. For a model of your own that no config can rebuild (defined in
    your script's ``__main__``, or an object given to ``accel_train.train``), build it
    yourself and call :func:`load_weights`.

    A config naming user code (``package.module:callable``) is imported only when the caller
    names it as ``model_name`` or opts in with ``allow_import=True`` (or :func:`user_code_allowed`).
    """
    from accel_train.models import create_model

    sd, meta = read_state_dict(source)
    given = {k: v for k, v in overrides.items() if v is not None}
    config, where = _resolved_config(meta, model_name, given, sd)
    if config.get("task") in ("classification", "regression") and "monitor" in config:  # accel_train.train's any task
        raise UserError(
            f"{source} holds your own model trained on your own batches ({config['task']}, not an image "
            "classifier): these commands rebuild image classifiers only; build your model and load the weights "
            "into it: accel_train.checkpoint.load_weights(model, path)"
        )
    _check_rebuild(config, model_name, allow_import, where)
    kwargs = {k: int(config[k]) for k in ("num_classes", "in_channels", "image_size") if config.get(k) is not None}
    try:
        model = create_model(str(config["model"]), **kwargs)
    except (ValueError, TypeError, UserError) as e:  # UserError: sizes beyond the models' limits
        source = f" (the sizes of {meta['config_path']})" if meta["config_path"] else ""
        raise UserError(f"cannot build model {config['model']!r} with {kwargs}{source}: {_short(e, 300)}") from None
    for key, value in kwargs.items():
        config[key] = value
    _load_into(sd, meta, model, strict=True)  # a mismatch names the weights file and its config
    model.eval()
    return LoadedModel(model, config)


def _standalone_tensors(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """CPU, contiguous tensors that own their storage: safetensors refuses shared or partial storages."""
    tensors: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in sd.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()  # tied weights
        elif ptr is not None:
            seen.add(ptr)
        if t.numel() and t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view into a bigger storage: keep only its own data
        tensors[name] = t
    return tensors


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

    tensors = _standalone_tensors(sd)

    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output directory {out}: {_short(e)}") from None
    weights = out / "model.safetensors"
    atomic_write(weights, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}), "weights")
    config_path = out / "config.json"
    if config_text is not None:
        write_text_atomic(config_path, config_text, "weights config")
    elif config_path.exists():
        config_path.unlink()
    return weights
