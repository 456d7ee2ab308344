"""Model registry: ``create_model(name, num_classes, in_channels, image_size)``.

Models are pure ``nn.Module``s: they know nothing about devices, processes
or configs. Layer sizes come from the constructor arguments.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.nn as nn

from accel_train.errors import UserError
from accel_train.limits import MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIZE, MAX_MODEL_PARAMS
from accel_train.models.lenet import LeNet
from accel_train.models.mnist_cnn import MnistCNN
from accel_train.models.resnet import ResNet18, tv_resnet18

ModelBuilder = Callable[..., nn.Module]

_MODELS: dict[str, ModelBuilder] = {
    "mnist_cnn": MnistCNN,
    "lenet": LeNet,
    "resnet18": ResNet18,
    "tv_resnet18": tv_resnet18,
}


def register_model(name: str, builder: ModelBuilder | None = None):
    """Register ``builder(num_classes=, in_channels=, image_size=)``; usable as a decorator."""

    def _register(fn):
        _MODELS[name] = fn
        return fn

    return _register(builder) if builder is not None else _register


def available_models() -> list[str]:
    return sorted(_MODELS)


def check_model_name(name: str) -> None:
    if name not in _MODELS:
        raise UserError(f"unknown model {name!r}; choose one of: {', '.join(available_models())}")


def min_image_size(name: str) -> int:
    """The smallest image side model ``name`` takes (a builder's ``min_image_size`` attribute; default 1)."""
    return int(getattr(_MODELS.get(name), "min_image_size", 1))


def create_model(name: str, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> nn.Module:
    """Build model ``name``; sizes it cannot take, or that would make it absurdly large, are one-line UserErrors."""
    check_model_name(name)
    sizes = {"num_classes": num_classes, "in_channels": in_channels, "image_size": image_size}
    limits = {"num_classes": MAX_CLASSES, "in_channels": MAX_CHANNELS, "image_size": MAX_IMAGE_SIZE}
    for key, value in sizes.items():
        low = min_image_size(name) if key == "image_size" else 1
        try:
            sizes[key] = operator.index(value) if not isinstance(value, bool) else None  # ints, numpy ints
        except TypeError:
            sizes[key] = None
        if sizes[key] is None or not low <= sizes[key] <= limits[key]:
            raise UserError(f"model {name} needs {key} between {low} and {limits[key]:,}, got {value!r}")
    if sizes["image_size"] > 256:  # count the parameters on the meta device, unallocated (slow the first time)
        with torch.device("meta"):
            count = sum(t.numel() for t in _MODELS[name](**sizes).state_dict().values())
    else:
        count = 0  # no model here is large below 257 pixels (lenet at 256: 24M parameters)
    if count > MAX_MODEL_PARAMS:
        raise UserError(
            f"model {name} with {sizes} would have {count:,} parameters (limit {MAX_MODEL_PARAMS:,}); "
            "use a smaller image_size"
        )
    return _MODELS[name](**sizes)
