"""Model registry: ``create_model(name, num_classes, in_channels, image_size)``.

``name`` is one of three things:

* a registered name (``small_cnn``, ``lenet``, ``mnist_cnn``, ``resnet18``, ``tv_resnet18``, ``airbench``, or your
  ``register_model``);
* ``tv:NAME``: any torchvision classification model, random weights (:mod:`accel_train.models.tv`);
* ``package.module:callable``: your own code, called as ``callable(num_classes=, in_channels=, image_size=)``
  (:mod:`accel_train.models.user`). Checking such a name never imports it; building the model does.

Models are pure ``nn.Module``s: they know nothing about devices, processes or configs. Layer sizes
come from the constructor arguments.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch
import torch.nn as nn

from accel_train.errors import UserError
from accel_train.limits import MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIZE, MAX_MODEL_PARAMS
from accel_train.models import tv, user
from accel_train.models.airbench import AirbenchNet
from accel_train.models.lenet import LeNet
from accel_train.models.mnist_cnn import MnistCNN
from accel_train.models.resnet import ResNet18, tv_resnet18
from accel_train.models.small_cnn import SmallCNN

ModelBuilder = Callable[..., nn.Module]

_MODELS: dict[str, ModelBuilder] = {
    "mnist_cnn": MnistCNN,
    "lenet": LeNet,
    "resnet18": ResNet18,
    "tv_resnet18": tv_resnet18,
    "airbench": AirbenchNet,
    "small_cnn": SmallCNN,
    "small_cnn_gn": functools.partial(SmallCNN, norm="group"),
}
_SPEC_HELP = "tv:NAME (a torchvision classifier, e.g. tv:resnet50) or package.module:callable (your own code)"


def register_model(name: str, builder: ModelBuilder | None = None):
    """Register ``builder(num_classes=, in_channels=, image_size=)``; usable as a decorator."""

    def _register(fn):
        _MODELS[name] = fn
        return fn

    return _register(builder) if builder is not None else _register


def available_models() -> list[str]:
    """The registered names (besides these, any ``tv:NAME`` and ``package.module:callable``)."""
    return sorted(_MODELS)


def is_torchvision(name: str) -> bool:
    return name.startswith(tv.PREFIX) and name not in _MODELS


def is_user_code(name: str) -> bool:
    """``package.module:callable`` that is not registered: building it imports user code."""
    return name not in _MODELS and user.is_import_spec(name)


def check_model_name(name: str) -> None:
    """A registered name, a known ``tv:NAME``, or a well-spelled ``package.module:callable`` (never imported).

    ``instance:module.Class`` names an object ``accel_train.train`` was given: valid, but never built.
    """
    if name in _MODELS or is_user_code(name) or user.is_instance_label(name):
        return
    if is_torchvision(name):
        tv.check_name(name.removeprefix(tv.PREFIX))
        return
    raise UserError(f"unknown model {name!r}; choose one of: {', '.join(available_models())}, or {_SPEC_HELP}")


def min_image_size(name: str) -> int:
    """The smallest image side model ``name`` takes (a builder's ``min_image_size`` attribute; default 1).

    ``tv:NAME``: found with meta-device forwards. User code: its attribute only if its module is
    already imported (this never imports).
    """
    if is_torchvision(name):
        check_model_name(name)
        return tv.min_image_size(name.removeprefix(tv.PREFIX))
    builder = _MODELS.get(name) or (user.already_imported(name) if is_user_code(name) else None)
    return int(getattr(builder, "min_image_size", 1))


def _builder(name: str) -> ModelBuilder:
    """The constructor of ``name``; user code is imported here."""
    check_model_name(name)
    if name in _MODELS:
        return _MODELS[name]
    if is_torchvision(name):
        return lambda **sizes: tv.build(name.removeprefix(tv.PREFIX), **sizes)
    if user.is_instance_label(name):
        raise user.rebuild_instance_error(name)
    return user.resolve(name)


def _checked_sizes(name: str, low: int, num_classes, in_channels, image_size) -> dict[str, int]:
    sizes = {"num_classes": num_classes, "in_channels": in_channels, "image_size": image_size}
    limits = {"num_classes": MAX_CLASSES, "in_channels": MAX_CHANNELS, "image_size": MAX_IMAGE_SIZE}
    for key, value in sizes.items():
        bottom = low if key == "image_size" else 1
        try:
            sizes[key] = operator.index(value) if not isinstance(value, bool) else None  # ints, numpy ints
        except TypeError:
            sizes[key] = None
        if sizes[key] is None or not bottom <= sizes[key] <= limits[key]:
            raise UserError(f"model {name} needs {key} between {bottom} and {limits[key]:,}, got {value!r}")
    return sizes


def create_model(name: str, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> nn.Module:
    """Build model ``name``; sizes it cannot take, or that would make it absurdly large, are one-line UserErrors."""
    builder = _builder(name)
    low = 1 if is_torchvision(name) else int(getattr(builder, "min_image_size", 1))  # tv: probed below
    sizes = _checked_sizes(name, low, num_classes, in_channels, image_size)
    if is_torchvision(name):
        tv.check_fits(name.removeprefix(tv.PREFIX), **sizes, max_params=MAX_MODEL_PARAMS)
    elif name in _MODELS and sizes["image_size"] > 256:  # count on the meta device, unallocated
        with torch.device("meta"):
            count = sum(t.numel() for t in builder(**sizes).state_dict().values())
        if count > MAX_MODEL_PARAMS:  # no model here is large below 257 pixels (lenet at 256: 24M parameters)
            raise UserError(
                f"model {name} with {sizes} would have {count:,} parameters (limit {MAX_MODEL_PARAMS:,}); "
                "use a smaller image_size"
            )
    model = builder(**sizes)
    if not isinstance(model, nn.Module):
        raise UserError(f"model {name} returned a {type(model).__name__}, not a torch.nn.Module; return the module")
    return model
