"""``metrics=``: names of ``evaluate`` metrics or callables, scored on the gathered predictions of the whole eval set.

Names accel_train ships (``accel_train.metrics.SHIPPED``: accuracy, f1, precision, recall,
matthews_correlation, mse, rmse, mae, r_squared) load offline from this package; any other name goes to
``evaluate.load(name)`` when the run is built (the hub, or its cache), and a name it cannot load is refused
then, in one line. A callable is called as ``fn(predictions, references)`` with two tensors and returns a
number or a dict of numbers. Each number is logged as ``eval_<name>``.

``monitor``: the key best/ and early stopping follow (default: the first metric's, else ``eval_loss``); lower
is better when a word of the key (split at ``_``) names a loss or an error (``loss``, ``mse``, ``rmse``, ``mae``,
``error``, ...: ``LOWER_IS_BETTER``), higher for the rest, unless ``monitor_mode`` says ``"min"`` or ``"max"``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel_train.errors import UserError

LOWER_IS_BETTER = ("loss", "mse", "rmse", "msle", "rmsle", "mae", "mape", "smape", "error", "errors", "perplexity",
                   "ppl", "nll", "entropy", "logloss", "kl", "divergence", "deviance", "distance", "fid", "kid", "bpc",
                   "bpd", "wer", "cer", "ter", "brier", "hamming", "regret", "cost", "risk", "eer", "fpr", "fnr",
                   "miss", "lpips", "err", "errs")  # words of a key (split at "_"), before the higher ones  # fmt: skip
HIGHER_IS_BETTER = ("accuracy", "acc", "f1", "precision", "recall", "auc", "auroc", "auprc", "roc", "ap", "map", "r2",
                    "squared", "matthews", "correlation", "corr", "mcc", "pearson", "pearsonr", "spearman",
                    "spearmanr", "kappa", "bleu", "sacrebleu", "rouge", "rouge1", "rouge2", "rougel", "rougelsum",
                    "meteor", "chrf", "exact", "match", "em", "iou", "miou", "dice", "jaccard", "ndcg", "mrr", "hit",
                    "hits", "top1", "top5", "psnr", "ssim", "bertscore", "coverage", "explained", "sensitivity",
                    "specificity", "tpr", "balanced", "score")  # fmt: skip
CLASS_AVERAGED = ("f1", "precision", "recall")  # shipped scores averaged over the run's classes


def _load(name: str):
    from accel_train.metrics import SHIPPED, load_metric

    if name in SHIPPED:
        return load_metric(name)
    try:
        import evaluate

        return evaluate.load(name)
    except Exception as exc:  # offline, or no such metric: the hub's own errors vary by version
        raise UserError(
            f"metric {name!r} is not one accel_train ships ({', '.join(SHIPPED)}) and evaluate.load({name!r}) "
            f"failed ({type(exc).__name__}: {str(exc)[:120]}); pass a function (predictions, references) -> "
            "number instead, or run once online so evaluate caches it"
        ) from None


class Scores:
    """The run's metrics, each ``(name, metric)``: an ``evaluate`` module or a callable."""

    def __init__(self, metrics: Any, monitor: str | None = None, monitor_mode: str | None = None, num_classes: int = 0):
        self.metrics, self.num_classes = _parse(metrics), num_classes
        self.monitor = _key(monitor) if monitor else (f"eval_{self.metrics[0][0]}" if self.metrics else "eval_loss")
        if monitor_mode not in (None, "min", "max"):
            raise UserError(f"monitor_mode must be 'min' or 'max', not {monitor_mode!r}")
        self.higher = monitor_mode == "max" if monitor_mode else _higher(self.monitor)
        self._keys: list[str] | None = None

    def names(self) -> list[str]:
        return [name for name, _ in self.metrics]

    def keys(self) -> list[str]:
        """The eval_ keys of the metrics (known once they have been computed; the names before)."""
        return self._keys if self._keys is not None else [f"eval_{name}" for name in self.names()]

    def compute(self, predictions: torch.Tensor, references: torch.Tensor) -> dict[str, float]:
        """``{eval_<name>: value}`` of every metric on the whole eval set's predictions."""
        out: dict[str, float] = {}
        for name, metric in self.metrics:
            if callable(metric) and not hasattr(metric, "compute"):
                value = metric(predictions, references)
            else:
                metric.add_batch(predictions=predictions.tolist(), references=references.tolist())
                classes = self.num_classes if getattr(metric, "config_name", None) in CLASS_AVERAGED else 0
                value = metric.compute(**({"num_classes": classes} if classes else {}))
                if isinstance(value, Mapping) and len(value) == 1:  # metrics={"val_f1": "f1"}: logged as eval_val_f1
                    value = next(iter(value.values()))
            out.update(_numbers(name, value))
        if self.monitor != "eval_loss" and self.monitor not in out:
            raise UserError(
                f"monitor {self.monitor!r} is none of the metrics' keys ({', '.join(out) or 'none'}): pass "
                "monitor= one of them"
            )
        self._keys = list(out)
        return out


def _higher(monitor: str) -> bool:
    """Whether a larger value of ``monitor`` is better, from the words of its key; refused when they do not say."""
    words = monitor.lower().split("_")
    flipped = any(word in ("neg", "negative") for word in words)  # scikit-learn's neg_mean_squared_error
    if any(word in LOWER_IS_BETTER for word in words):
        return flipped
    if any(word in HIGHER_IS_BETTER for word in words):
        return not flipped
    raise UserError(
        f"monitor {monitor!r}: accel_train cannot tell from its name whether higher or lower is better; pass "
        "monitor_mode='max' or monitor_mode='min'"
    )


def _key(monitor: str) -> str:
    return monitor if monitor.startswith("eval_") else f"eval_{monitor}"


def _parse(metrics: Any) -> list[tuple[str, Any]]:
    if metrics is None:
        return []
    if isinstance(metrics, (str, Callable)) and not isinstance(metrics, Mapping):
        metrics = [metrics]
    items = list(metrics.items()) if isinstance(metrics, Mapping) else [(None, m) for m in metrics]
    parsed = []
    for name, metric in items:
        if isinstance(metric, str):
            parsed.append((name or metric, _load(metric)))
        elif callable(metric):
            name = name or getattr(metric, "__name__", "")
            if not name.isidentifier():
                raise UserError(f"metric {metric!r:.60} has no name; pass metrics={{'name': fn}}")
            parsed.append((name, metric))
        else:
            raise UserError(f"metrics takes names and functions, not a {type(metric).__name__}")
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise UserError(f"metrics names a metric twice: {names}")
    return parsed


def _numbers(name: str, value: Any) -> dict[str, float]:
    """A metric's result as ``{eval_<key>: float}``: a dict's numbers by their keys, a number by the name."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    items = value.items() if isinstance(value, Mapping) else [(name, value)]
    out = {}
    for key, number in items:
        if isinstance(number, torch.Tensor) and number.numel() == 1:
            number = number.item()
        if isinstance(number, (Sequence, bool)) or not isinstance(number, numbers.Real):
            raise UserError(f"metric {name!r} returned {key}={number!r:.60}; metrics must return numbers")
        out[f"eval_{key}"] = float(number)
    return out
