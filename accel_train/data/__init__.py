"""Dataset registry: ``build_dataset(DataConfig) -> DataSplits``.

Builders are referenced as ``"module:function"`` strings and imported only
when used, so ``train.py --help`` stays fast and optional dependencies load
only for the dataset in use. ``register_dataset`` adds your own.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from accel_train.data.settings import DataConfig
from accel_train.errors import UserError

if TYPE_CHECKING:
    from accel_train.data.base import DataSplits

_BASE_NAMES = ("DatasetInfo", "DataSplits", "TensorImageDataset", "collate_batch")


def __getattr__(name: str):
    """torch loads with ``data.base``, on first use: the flag parser imports ``data.settings`` through here."""
    if name in _BASE_NAMES:
        from accel_train.data import base

        return getattr(base, name)
    raise AttributeError(f"module 'accel_train.data' has no attribute {name!r}")


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
    "shards": "accel_train.data.shards:build_shards",
}

#: How dataset errors say to fetch missing or damaged files: the training script's ``--download``. A
#: program without that flag passes its own words to ``build_dataset(download_hint=...)``.
DOWNLOAD_HINT: contextvars.ContextVar[str] = contextvars.ContextVar("download_hint", default="--download")

__all__ = [
    "DOWNLOAD_HINT",
    "DataConfig",
    "DataSplits",
    "DatasetInfo",
    "TensorImageDataset",
    "available_datasets",
    "build_dataset",
    "check_dataset_name",
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


def _takes_test_only(builder: Callable) -> bool:
    try:
        return "test_only" in inspect.signature(builder).parameters
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return False


def build_dataset(cfg: DataConfig, *, test_only: bool = False, download_hint: str | None = None) -> DataSplits:
    """The dataset ``cfg.dataset`` names.

    ``test_only``: only ``test`` and ``info`` are needed (an evaluation). Builders that take a
    ``test_only`` keyword then skip the training split (``train`` comes back empty, and its files
    need not exist); the others load both. ``download_hint``: the words this program's errors use
    for fetching missing files (default: ``--download``, a flag of the training script only).
    """
    token = DOWNLOAD_HINT.set(download_hint) if download_hint else None
    try:
        return _build(cfg, test_only)
    finally:
        if token is not None:
            DOWNLOAD_HINT.reset(token)


def check_dataset_name(name: str) -> None:
    """A registered name or ``<prefix>:<argument>``; anything else is a one-line UserError."""
    prefix, sep, arg = name.partition(":")
    if name in _BUILDERS:
        return
    if sep and prefix in _PREFIX_BUILDERS:
        if not arg:
            raise UserError(f"--dataset {name!r} needs a path or name after '{prefix}:', e.g. '{prefix}:./my_data'")
        return
    raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(available_datasets())}")


def _build(cfg: DataConfig, test_only: bool) -> DataSplits:
    name = cfg.dataset
    check_dataset_name(name)
    if name in _BUILDERS:
        builder = _resolve(_BUILDERS[name])
        return builder(cfg, test_only=True) if test_only and _takes_test_only(builder) else builder(cfg)
    prefix, _, arg = name.partition(":")
    return _resolve(_PREFIX_BUILDERS[prefix])(cfg, arg)
