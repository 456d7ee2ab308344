"""The task layer: what the loop does with a batch, and how a run is scored.

The trainer calls a task for every task-specific thing and nothing else: ``loaders`` (the train loader's batches
are ``(inputs, labels, indices)``), ``forward`` (outputs and loss of one micro-batch), ``counted`` and
``train_values`` (the train records), ``evaluate`` (the eval metrics, exact on any number of processes),
``monitor``/``higher`` (what best/ and early stopping follow), ``summary``/``result_line``/``model_config``
(what the run writes). Two tasks:

* :class:`~accel_train.tasks.image.ImageTask`: image classification, as it has always run (``--dataset``,
  ``accel_train.train`` on images);
* :class:`~accel_train.tasks.generic.GenericTask`: any model on any batches (text, regression, ...), through
  ``accel_train.train(..., collate_fn=, loss_fn=, metrics=, predict_fn=, monitor=)``.

What only an image classifier has (image statistics, augmentation, mixup, label smoothing, TTA, pretrained
weights, the confusion matrix, accel-predict's preprocessing) is refused in one line when asked for on the
generic task (:func:`refuse_image_options`), and otherwise skipped.
"""

from __future__ import annotations

from typing import Any

from accel_train.errors import UserError
from accel_train.tasks.generic import GenericTask
from accel_train.tasks.image import ImageTask

__all__ = ["GenericTask", "ImageTask", "check_resumed_task", "refuse_image_options"]

IMAGE_ONLY = (
    "pretrained", "freeze", "head_lr", "bn_stats", "image_size", "image_column", "label_column", "augment",
    "crop_padding", "crop_padding_mode", "label_smoothing", "mixup", "cutmix", "tta", "channels_last",
)  # fmt: skip


def refuse_image_options(cfg, task) -> None:
    """The options a non-image task cannot honour, refused in one line when the user set them."""
    if task.kind == "image":
        return
    given = [name for name in IMAGE_ONLY if name in (getattr(cfg, "given", None) or ())]
    if given:
        names = ", ".join(f"--{n.replace('_', '-')}" for n in given)
        raise UserError(
            f"{names}: image classification only; this run trains your model on {task.describe().split(';')[0]}: "
            "drop it"
        )


def check_resumed_task(record: Any, task) -> None:
    """A resume must score the run as its checkpoint did: the best so far and the early-stopping count are
    values of its monitor (``record``: the checkpoint's ``resolved["task"]``)."""
    now = task.record()
    if record == now or (record is None and now is None):
        return
    said = ", ".join(f"{k} {record.get(k) if isinstance(record, dict) else None!r} -> {v!r}"
                     for k, v in (now or {}).items() if not isinstance(record, dict) or record.get(k) != v)  # fmt: skip
    raise UserError(
        f"this resume scores the run otherwise than its checkpoint ({said or 'another task'}); its best/ and "
        "early stopping were measured so: resume with the same task, metrics, monitor, loss_fn and predict_fn, or "
        "start a new --output-dir"
    )
