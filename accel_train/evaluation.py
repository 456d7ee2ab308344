"""Exact evaluation on any accelerate setup, as the training loop runs it: ``evaluate_model``.

(``accel-evaluate`` runs it on saved weights: ``saved_eval.py``.)

Accuracy is counted on the gathered tensors, as accelerate's own ``cv_example.py`` counts it: exact integers,
no library to import. The training loop's evaluations use that count alone; importing ``evaluate`` (with
``datasets``, ``pandas`` and ``scipy.stats``) would cost a run seconds for a division. ``accel-evaluate`` also
passes its ``evaluate`` metric (:func:`accel_train.metrics.load_metric`), which scores the same predictions, and
a disagreement between the two is an error, never a number.
"""

from __future__ import annotations

from pathlib import Path
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
    full_batches: bool = False,
) -> dict[str, Any]:
    """Exact evaluation: ``gather_for_metrics`` drops the samples padded for even sharding.

    ``metric``: None, or an ``evaluate``-style metric (``add_batch``/``compute`` returning ``accuracy``) that
    scores the same predictions; its accuracy must equal the exact count.

    ``tta="flip"``: the logits are the mean of each image's and its left-right mirror's (airbench's TTA).

    ``full_batches`` (``--bitwise``): a short last batch is padded to the loader's batch size before the forward,
    and the padding's outputs dropped. Several processes always evaluate full batches (accelerate pads them for
    even sharding), and a CPU's kernels may round an image's logits by the batch's size (lenet with AMX: 2e-8
    apart at 8 and 16 images), so one process pads too and ``eval_loss`` is the same bits on any setup.
    """
    sampler = getattr(loader, "batch_sampler", None)  # accelerate's loaders keep the size there
    full = int(getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", 0) or 0) if full_batches else 0
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    preds_all, refs_all = [], []
    with torch.no_grad():
        for images, labels in loader:
            real = len(images)
            if 0 < real < full:  # repeats of the first image: their outputs are dropped below
                images = torch.cat([images, images[:1].expand(full - real, *images.shape[1:])])
            with acc.autocast():
                x = normalizer(images)
                logits = model(x)
                if tta == "flip":
                    logits = 0.5 * (logits + model(x.flip(-1)))
            logits = logits[:real]
            losses = F.cross_entropy(logits.float(), labels, reduction="none")
            preds = logits.argmax(dim=1)
            preds, labels, losses = acc.gather_for_metrics((preds, labels, losses))
            loss_sum += losses.double().sum()
            preds_all.append(preds.cpu())
            refs_all.append(labels.cpu())
    model.train(was_training)
    preds, refs = torch.cat(preds_all), torch.cat(refs_all)
    n = len(refs)
    accuracy = int((preds == refs).sum()) / n if n else 0.0
    if metric is not None:
        metric.add_batch(predictions=preds.tolist(), references=refs.tolist())
        scored = metric.compute()["accuracy"]
        if scored != accuracy:
            raise RuntimeError(f"the metric scored accuracy {scored} but {accuracy} of {n} predictions are right")
    out: dict[str, Any] = {
        "eval_loss": loss_sum.item() / max(n, 1),
        "eval_accuracy": accuracy,
        "eval_samples": n,
    }
    if with_confusion:
        out["confusion"] = confusion_matrix(preds, refs, num_classes)
    return out


def best_note(
    best_step: int | None, accuracy: float | None, final_step: int, best: Path, key: str = "eval_accuracy",
    images: bool = True,
) -> dict[str, str]:  # fmt: skip
    """``{"best_note": line}`` when ``best`` (``best/``) holds other weights than the final model: it was chosen by
    eval_accuracy on the test split, the one that reports it (a run has no separate validation split), so that
    accuracy is optimistic; ``{}`` otherwise."""
    if best_step is None or accuracy is None or best_step == final_step:
        return {}
    how = (
        f"images kept out of training and testing with accel-evaluate --weights {best} --dataset imagefolder:DIR"
        if images
        else "data kept out of training and testing"
    )
    return {
        "best_note": f"best/ (step {best_step}, {key} {accuracy:.4f}) was chosen on the test split that "
        f"also scores it (there is no separate validation split), so that {key[5:] if images else 'figure'} is "
        f"optimistic: score it on {how}"
    }
