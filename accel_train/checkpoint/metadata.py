"""Checks of the JSON a checkpoint or an export carries, before any value in it is used.

``check_model_config``: an export's ``config.json`` (or a checkpoint's ``progress.json["model_config"]``),
read by ``load_model`` for ``accel-evaluate``, ``accel-predict`` and ``convert_checkpoint.py``.
``check_progress``: a checkpoint's ``progress.json``, read by every resume (``state.read_progress``); the run
config it carries is checked by the config layer (``config.check_saved_config``), which owns its fields.
Each wrong type, range or non-finite number is one :class:`CheckpointError` line that names the file
and the field. Fields that are absent are left to the readers' defaults; unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any

from accel_train.errors import UserError
from accel_train.json_checks import Checker, is_int, is_number, shown
from accel_train.limits import MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIZE

_SIZES = {"num_classes": MAX_CLASSES, "in_channels": MAX_CHANNELS, "image_size": MAX_IMAGE_SIZE}
_COUNTERS = ("epoch", "step_in_epoch", "global_step", "samples_seen", "nonfinite_skipped", "fp16_skipped_steps")
_RESOLVED_COUNTS = ("world_size", "global_batch", "micro_batch", "accum_steps", "total_steps", "steps_per_epoch")


# --------------------------------------------------------------------------- config.json


def check_model_config(config: Any, where: str) -> dict:
    """``config`` (an export's ``config.json``) with every present field checked; returns it."""
    check = Checker(where, "fix the file (or re-export the model with convert_checkpoint.py)")
    if not isinstance(config, dict):
        check.fail("the file", f"must hold a JSON object, got {shown(config)}")
    model = config.get("model")
    if "model" in config:
        from accel_train.models import available_models, check_model_name, min_image_size

        if not isinstance(model, str):
            check.fail("model", f"must be a model name, got {shown(model)}")
        try:
            check_model_name(model)  # spelling only: tv:NAME and package.module:callable are never imported here
        except UserError:
            known = ", ".join(available_models())
            check.fail("model", f"must be one of {known}, tv:NAME or package.module:callable, got {shown(model)}")
        low = min_image_size(model)
    else:
        low = 1
    for key, high in _SIZES.items():
        check.integer(config, key, low if key == "image_size" else 1, high)
    for key in ("mean", "std"):
        if key in config:
            _check_channels(check, config, key)
    names = config.get("class_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
            check.fail("class_names", f"must be a list of names, got {shown(names)}")
        if "num_classes" in config and len(names) != config["num_classes"]:
            check.fail("class_names", f"has {len(names)} names but num_classes is {config['num_classes']}")
    if config.get("dataset") is not None and not isinstance(config["dataset"], str):
        check.fail("dataset", f"must be a dataset name, got {shown(config['dataset'])}")
    return config


def _check_channels(check: Checker, config: dict, key: str) -> None:
    """``mean``/``std``: a finite number or a list of them, one per input channel (or one for all); std > 0."""
    value = config[key]
    values = value if isinstance(value, list) else [value]
    channels = config.get("in_channels")
    if not values or not all(is_number(v) for v in values):
        check.fail(key, f"must be a finite number or a list of them (one per channel), got {shown(value)}")
    if len(values) not in (1, channels if is_int(channels) else len(values)):
        check.fail(key, f"has {len(values)} values but in_channels is {channels}")
    if key == "std" and any(v <= 0 for v in values):
        check.fail(key, f"must be positive, got {shown(value)}")


# --------------------------------------------------------------------------- progress.json


def check_progress(data: Any, where: str) -> dict:
    """A checkpoint's ``progress.json`` with its state, schedule, config and model config checked; returns it."""
    check = Checker(where, "the checkpoint is damaged: resume from another checkpoint or start a new --output-dir")
    if not isinstance(data, dict):
        check.fail("the file", f"must hold a JSON object, got {shown(data)}")
    if "state" not in data:
        check.fail("state", "is missing (the training progress: global_step, epoch, ...)")
    state = check.mapping(data, "state", optional=False)
    if "global_step" not in state:
        check.fail("state.global_step", "is missing")
    for key in _COUNTERS:
        check.integer(state, key, 0, prefix="state.")
    if state.get("best_metric") is not None and not is_number(state["best_metric"]):
        check.fail("state.best_metric", f"must be a finite number or null, got {shown(state['best_metric'])}")
    for key in ("best_step", "last_eval_step"):
        if state.get(key) is not None:
            check.integer(state, key, 0, prefix="state.")
    check.mapping(state, "extra")
    check.mapping(data, "scheduler")
    resolved = check.mapping(data, "resolved")
    for key in _RESOLVED_COUNTS:
        check.integer(resolved, key, 0, prefix="resolved.")
    if "lr" in resolved and not is_number(resolved["lr"]):
        check.fail("resolved.lr", f"must be a finite number, got {shown(resolved['lr'])}")
    if data.get("model_config") is not None:
        check_model_config(check.mapping(data, "model_config"), f"{where} (model_config)")
    check.mapping(data, "config")  # its fields are the config layer's to check (``config.check_saved_config``)
    return data
