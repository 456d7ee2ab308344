"""Exact evaluation on any accelerate setup, as the training loop runs it: ``evaluate_model``.

(``accel-evaluate`` runs it on saved weights: ``saved_eval.py``.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accel_train.data.pipeline import BatchNormalizer
from accel_train.metrics import confusion_matrix


def evaluate_model(
    acc,
    model: nn.Module,
    loader,
    normalizer: BatchNormalizer,
    metric,
    num_classes: int,
    with_confusion: bool = False,
    tta: str = "none",
) -> dict[str, Any]:
    """Exact evaluation: ``gather_for_metrics`` drops the samples padded for even sharding.

    ``tta="flip"``: the logits are the mean of each image's and its left-right mirror's (airbench's TTA).
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    preds_all, refs_all = [], []
    with torch.no_grad():
        for images, labels in loader:
            with acc.autocast():
                x = normalizer(images)
                logits = model(x)
                if tta == "flip":
                    logits = 0.5 * (logits + model(x.flip(-1)))
            losses = F.cross_entropy(logits.float(), labels, reduction="none")
            preds = logits.argmax(dim=1)
            preds, labels, losses = acc.gather_for_metrics((preds, labels, losses))
            loss_sum += losses.double().sum()
            preds_all.append(preds.cpu())
            refs_all.append(labels.cpu())
    model.train(was_training)
    preds, refs = torch.cat(preds_all), torch.cat(refs_all)
    metric.add_batch(predictions=preds.tolist(), references=refs.tolist())
    n = len(refs)
    out: dict[str, Any] = {
        "eval_loss": loss_sum.item() / max(n, 1),
        "eval_accuracy": metric.compute()["accuracy"],
        "eval_samples": n,
    }
    if with_confusion:
        out["confusion"] = confusion_matrix(preds, refs, num_classes)
    return out
