"""Dataset registry: ``build_dataset(DataConfig) -> DataSplits``.

Builders are referenced as ``"module:function"`` strings and imported only
when used, so ``train.py --help`` stays fast and optional dependencies load
only for the dataset in use. ``register_dataset`` adds your own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from accel_train.data.base import DataConfig, DatasetInfo, DataSplits, TensorImageDataset, collate_batch
from accel_train.errors import UserError

_BUILDERS: dict[str, str | Callable[[DataConfig], DataSplits]] = {
    "digits": "accel_train.data.digits:build_digits",
    "synthetic": "accel_train.data.synthetic:build_synthetic",
    "mnist": "accel_train.data.vision:build_mnist",
    "fashion_mnist": "accel_train.data.vision:build_fashion_mnist",
    "cifar10": "accel_train.data.vision:build_cifar10",
}
# "<prefix>:<argument>" datasets; the builder gets (cfg, argument).
_PREFIX_BUILDERS: dict[str, str] = {
    "imagefolder": "accel_train.data.folder:build_imagefolder",
    "hf": "accel_train.data.hf:build_hf",
}

__all__ = [
    "DataConfig",
    "DataSplits",
    "DatasetInfo",
    "TensorImageDataset",
    "available_datasets",
    "build_dataset",
    "collate_batch",
    "register_dataset",
]


def register_dataset(name: str, builder: Callable[[DataConfig], DataSplits] | None = None):
    """Register ``builder`` under ``name``; usable as a decorator."""

    def _register(fn):
        _BUILDERS[name] = fn
        return fn

    return _register(builder) if builder is not None else _register


def available_datasets() -> list[str]:
    return sorted(_BUILDERS) + [f"{p}:<path>" for p in sorted(_PREFIX_BUILDERS)]


def _resolve(target):
    if callable(target):
        return target
    module, fn = target.split(":")
    return getattr(importlib.import_module(module), fn)


def build_dataset(cfg: DataConfig) -> DataSplits:
    name = cfg.dataset
    if name in _BUILDERS:
        return _resolve(_BUILDERS[name])(cfg)
    prefix, sep, arg = name.partition(":")
    if sep and prefix in _PREFIX_BUILDERS:
        if not arg:
            raise UserError(f"--dataset {name!r} needs a path or name after '{prefix}:', e.g. '{prefix}:./my_data'")
        return _resolve(_PREFIX_BUILDERS[prefix])(cfg, arg)
    raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(available_datasets())}")
