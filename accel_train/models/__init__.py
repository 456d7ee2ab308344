"""Model registry: ``create_model(name, num_classes, in_channels, image_size)``.

Models are pure ``nn.Module``s: they know nothing about devices, processes
or configs. Layer sizes come from the constructor arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from accel_train.errors import UserError
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


def create_model(name: str, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> nn.Module:
    check_model_name(name)
    return _MODELS[name](num_classes=num_classes, in_channels=in_channels, image_size=image_size)
