"""Metrics through the `evaluate` library, from modules shipped in this package."""

from __future__ import annotations

from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent


def load_metric(name: str = "accuracy"):
    """``evaluate.load`` a metric module shipped with accel_train, by path: works offline."""
    import evaluate

    path = _HERE / name / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"no local metric {name!r} in {_HERE}")
    return evaluate.load(str(path))


def confusion_matrix(predictions: torch.Tensor, references: torch.Tensor, num_classes: int) -> torch.Tensor:
    idx = references.long() * num_classes + predictions.long()
    return torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes)
