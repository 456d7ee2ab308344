"""What a batch of any task is: its labels, how the model is called on it, what it returned (logits, values, its
own loss), the default losses, the predictions and labels the metrics score, and the randomness keyed on it.

Used by :class:`accel_train.tasks.generic.GenericTask`, which says what a run does with them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from accel_train.data.pipeline import seed_of, seeded_from
from accel_train.errors import UserError

LABEL_KEYS = ("labels", "label", "target", "targets")
IGNORE = -100  # a label the loss and the metrics leave out (padding, a token not to score)


def labels_of(batch: Any) -> torch.Tensor:
    """The batch's labels: a dict's ``labels``/``label``/``target`` entry, or a tuple's last element."""
    if isinstance(batch, Mapping):
        key = next((k for k in LABEL_KEYS if k in batch), None)
        if key is None:
            raise UserError(
                f"a batch is a dict with keys {sorted(batch)[:8]} and no labels ({', '.join(LABEL_KEYS)}); "
                "add the labels to each sample (a Hugging Face model computes its loss from 'labels')"
            )
        labels = batch[key]
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        labels = batch[-1]
    else:
        raise UserError(
            f"a batch is a {type(batch).__name__}; samples must be dicts with labels or (inputs, target) pairs"
        )
    if not isinstance(labels, torch.Tensor):
        raise UserError(f"the labels collate to a {type(labels).__name__}, not a tensor; collate_fn must return one")
    return labels


def call(model, batch: Any):
    """``model(**batch)`` for a dict, ``model(*inputs)`` for ``(inputs, ..., target)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*batch[:-1])


def _tuple_loss(outputs: Any) -> bool:
    """Whether ``outputs`` is ``(loss, logits, ...)``: a Hugging Face model's with ``return_dict=False``."""
    return (
        isinstance(outputs, (tuple, list)) and len(outputs) > 1
        and isinstance(outputs[0], torch.Tensor) and outputs[0].dim() == 0 and isinstance(outputs[1], torch.Tensor)
    )  # fmt: skip


def output_tensor(outputs: Any) -> torch.Tensor:
    """The scores or values a model returned: ``outputs.logits``, the tensor itself, or a tuple's first (its
    second after a loss: ``(loss, logits, ...)``)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        logits = outputs[1] if _tuple_loss(outputs) else outputs[0]
    if not isinstance(logits, torch.Tensor):
        raise UserError(
            f"the model returned a {type(outputs).__name__} without logits; return a tensor, or pass "
            "predict_fn=(outputs, batch) -> predictions"
        )
    return logits


def class_loss(logits: torch.Tensor, labels: torch.Tensor, check: bool) -> tuple[torch.Tensor, str]:
    """Cross-entropy of ``[..., classes]`` logits for integer labels (-100 left out), or binary cross-entropy of
    one logit per label; ``check`` (the first batch): the labels fit the logits, said in one line otherwise."""
    if logits.shape == labels.shape and labels.dim() > 1:  # [B, K] labels of 0/1: several labels per sample
        raise UserError(
            f"the model's logits are {list(logits.shape)} for integer labels of the same shape: several labels per "
            "sample (multi-label); pass loss_fn=lambda out, batch: F.binary_cross_entropy_with_logits(out, "
            "batch[-1].float()) (predictions are then each logit above 0)"
        )
    if logits.dim() != labels.dim() + 1 or logits.shape[:-1] != labels.shape:
        raise UserError(
            f"the model's logits are {list(logits.shape)} for integer labels {list(labels.shape)}: a classification "
            "needs [..., classes] logits; for a regression make the targets float (.float())"
        )
    classes, counted = logits.shape[-1], labels != IGNORE
    if check and bool(counted.any()):
        low, high = int(labels[counted].min()), int(labels[counted].max())
        if low < 0 or high >= max(classes, 2):
            raise UserError(
                f"labels from {low} to {high} for {classes} logit(s): a classification needs labels 0..classes-1 "
                "(-100: left out); for a regression make the targets float (.float())"
            )
    if classes == 1:  # one logit: a binary classifier, 1 when the logit is above 0
        each = F.binary_cross_entropy_with_logits(logits[..., 0].float(), labels.clamp(min=0).float(), reduction="none")
        return (each * counted).sum() / counted.sum().clamp(min=1), "binary cross-entropy of the logit"
    flat = logits.float().reshape(-1, classes)
    return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE), "cross-entropy of the logits"


def refuse_lists(batch: Any) -> None:
    """A batch whose values collated to lists (a ``datasets.Dataset`` read without a torch format), refused."""
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    if any(isinstance(v, list) for v in values):
        raise UserError(
            "the samples' values collate to lists, not tensors (a datasets.Dataset without a torch format): call "
            "dataset.set_format('torch'), or pass collate_fn= (e.g. transformers' DataCollatorWithPadding)"
        )


def scored(predictions: torch.Tensor, references: torch.Tensor, classification: bool) -> tuple[torch.Tensor, ...]:
    """A batch's predictions and labels as the metrics take them: per position when the labels have one per
    token (flattened), a classification's -100 labels left out; refused in one line when they do not pair up."""
    predictions, references = predictions.detach().cpu(), references.detach().cpu()
    if classification and predictions.is_floating_point():
        raise UserError(
            f"the predictions are {predictions.dtype} for a classification (probabilities?): predict_fn must "
            "return class ids, e.g. predict_fn=lambda out, batch: (torch.sigmoid(out) > 0.5).long()"
        )
    if predictions.shape != references.shape and predictions.numel() == references.numel():
        predictions = predictions.reshape(references.shape)  # a predict_fn's [B, 1] for [B] labels
    if predictions.shape != references.shape:
        raise UserError(
            f"the predictions are {list(predictions.shape)} for labels {list(references.shape)}: they must pair up "
            "(one per label); pass predict_fn=(outputs, batch) -> predictions"
        )
    predictions, references = predictions.reshape(-1), references.reshape(-1)
    if classification:
        kept = references != IGNORE
        predictions, references = predictions[kept], references[kept]
    return predictions, references


def draws(collate: Callable, samples: list) -> bool:
    """Whether collating ``samples`` twice, with the host's generators seeded otherwise, gives other batches."""
    first = [seeded_collate(collate, samples, key) for key in (b"accel_train check 1", b"accel_train check 2")]
    return not _same(*first)


def seeded_collate(collate: Callable, samples: list, key: bytes):
    with seeded_from(key):
        return collate(samples)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def own_loss(outputs: Any) -> torch.Tensor | None:
    if _tuple_loss(outputs):
        return outputs[0]
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


@contextmanager
def keyed_rng(seed: int, epoch: int, indices: torch.Tensor, device: torch.device, check: bool = True):
    """torch's generators seeded from ``(seed, epoch, indices)`` inside, restored after; yields a list that holds,
    after the block, whether the block drew from them (``check``; else it stays empty: no copies of the states)."""
    key = f"{seed}:{epoch}:".encode() + indices.detach().cpu().numpy().tobytes()
    devices = [device] if device.type == "cuda" else []
    drew: list[bool] = []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed_of(key))
        seeded = _states(devices) if check else None
        try:
            yield drew
        finally:  # before fork_rng puts the outer states back
            if seeded is not None:
                drew.append(not all(torch.equal(a, b) for a, b in zip(seeded, _states(devices), strict=True)))


def _states(devices: list[torch.device]) -> list[torch.Tensor]:
    return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


def numel(sample: Any) -> int:
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    if isinstance(sample, Mapping):
        return sum(numel(v) for v in sample.values())
    if isinstance(sample, (tuple, list)):
        return sum(numel(v) for v in sample)
    return 1
