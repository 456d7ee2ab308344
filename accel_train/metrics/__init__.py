"""Metrics through the `evaluate` library, from modules shipped in this package (``accel-evaluate`` scores
through them; the training loop counts its accuracy on the tensors: see :mod:`accel_train.evaluation`).

A metric is built the first time it is used, not when it is loaded: importing ``evaluate`` costs about 2.5 s
(it imports ``datasets``, and ``scipy.stats`` for its evaluators). It is built from this package's module, not
with ``evaluate.load``, which copies the script into ``HF_MODULES_CACHE`` under a file lock on every rank; and
it keeps its predictions in memory (``keep_in_memory=True``), so evaluating writes no Arrow cache file and
takes no lock either. Every rank computes it from the same gathered predictions, so all ranks agree without a
collective.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent


class LazyMetric:
    """An ``evaluate.Metric`` of this package, built at the first ``add_batch``/``compute``."""

    def __init__(self, name: str, config_name: str | None = None):
        self.name, self.config_name = name, config_name
        self._metric = None

    @property
    def metric(self):
        if self._metric is None:
            import evaluate

            module = importlib.import_module(f"{__name__}.{self.name}.{self.name}")
            cls = next(
                v
                for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, evaluate.Metric) and v is not evaluate.Metric
            )
            config = {"config_name": self.config_name} if self.config_name else {}
            self._metric = cls(keep_in_memory=True, **config)
        return self._metric

    def add_batch(self, **kwargs: Any) -> None:
        self.metric.add_batch(**kwargs)

    def compute(self, **kwargs: Any) -> dict[str, Any] | None:
        return self.metric.compute(**kwargs)


SCORES = ("f1", "precision", "recall", "matthews_correlation", "mse", "rmse", "mae", "r_squared")  # scores/scores.py
SHIPPED = ("accuracy", *SCORES)


def load_metric(name: str = "accuracy") -> LazyMetric:
    """A metric module shipped with accel_train (works offline; ``SHIPPED`` names them), built when first used."""
    if name in SCORES:
        return LazyMetric("scores", config_name=name)
    if not (_HERE / name / f"{name}.py").is_file():
        raise ValueError(f"no local metric {name!r} in {_HERE}")
    return LazyMetric(name)


def confusion_matrix(predictions: torch.Tensor, references: torch.Tensor, num_classes: int) -> torch.Tensor:
    idx = references.long() * num_classes + predictions.long()
    return torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes)
