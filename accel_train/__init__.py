"""accel_train: one Accelerate training loop for every setup, from a laptop CPU to multi-node DDP.

``accel_train.train(model, train_dataset, eval_dataset, **options)`` trains your own module on your own
data with that loop (:mod:`accel_train.api`); ``accel_train.load_weights(model, path)`` loads what a run
saved into your module, and ``accel_train.load_model(path)`` rebuilds a model its config names
(:mod:`accel_train.checkpoint.weights`). Each is imported on first use, so ``import accel_train`` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_model", "load_weights", "train"]


def __dir__() -> list[str]:
    """What completion and ``dir(accel_train)`` offer: the lazily imported API too."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def __getattr__(name: str) -> Any:
    if name == "train":
        from accel_train.api import train

        return train
    if name in ("load_weights", "load_model"):
        from accel_train.checkpoint import weights

        return getattr(weights, name)
    raise AttributeError(f"module 'accel_train' has no attribute {name!r}")
