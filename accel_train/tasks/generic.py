"""Any model, any task: batches passed to the model as they come, the model's own loss, metrics on its predictions.

A batch is what the dataset's samples collate to (``collate_fn``, or torch's ``default_collate``): a dict (a
Hugging Face tokenized batch) is passed as ``model(**batch)``; a tuple ``(inputs, ..., target)`` as
``model(inputs, ...)``. The labels are the dict's ``labels``/``label``/``target`` entry or the tuple's last one:
integers make a classification, floats a regression. The loss is ``loss_fn(outputs, batch)``, else the model's
own (``outputs.loss``, as Hugging Face models return when given ``labels``), else cross-entropy on the logits
(classification) or the mean squared error of the output (regression).

Randomness drawn inside ``forward`` (a transformer's attention dropout, drawn by ``scaled_dot_product_attention``
from torch's global generator) is keyed on the micro-batch: the generator is seeded from ``(seed, epoch, the
samples' indices)`` around each training forward and put back after, so the same micro-batch draws the same
masks on any number of processes and after a resume (``nn.Dropout`` layers are keyed on each sample, as for
images: :mod:`accel_train.features.dropout`).

Evaluation is exact on any number of processes: each rank scores a contiguous block of the eval set (no
sample padded or dropped), the predictions and labels are gathered in the set's order, and the metrics
(:mod:`accel_train.tasks.scores`) are computed from all of them on every rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Subset, default_collate

from accel_train.data.pipeline import make_loader
from accel_train.errors import UserError
from accel_train.evaluation import best_note
from accel_train.tasks.scores import Scores

LABEL_KEYS = ("labels", "label", "target", "targets")
DRAWS_NOTE = (
    "accel_train: note: the model draws random numbers inside forward besides its nn.Dropout layers (attention "
    "dropout, say): they are keyed on each micro-batch, so runs at the same micro-batch (--max-device-batch N, as "
    "--bitwise takes) draw the same ones on any setup and after a resume; at another micro-batch they differ"
)
TOKENS_NOTE = (
    "accel_train: note: the labels are per position ([batch, tokens]): the loss is a mean over each micro-batch's "
    "labelled tokens, so 1 and N processes (or accumulation steps) give the same weights only when every "
    "micro-batch holds as many labelled tokens; pass loss_fn= to weigh them otherwise"
)
PROBE_SCAN = 1024  # samples measured to pick the largest ones for --max-device-batch auto
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


def _class_loss(logits: torch.Tensor, labels: torch.Tensor, check: bool) -> tuple[torch.Tensor, str]:
    """Cross-entropy of ``[..., classes]`` logits for integer labels (-100 left out), or binary cross-entropy of
    one logit per label; ``check`` (the first batch): the labels fit the logits, said in one line otherwise."""
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


def _refuse_lists(batch: Any) -> None:
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


def _own_loss(outputs: Any) -> torch.Tensor | None:
    if _tuple_loss(outputs):
        return outputs[0]
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


@contextmanager
def keyed_rng(seed: int, epoch: int, indices: torch.Tensor, device: torch.device, check: bool = True):
    """torch's generators seeded from ``(seed, epoch, indices)`` inside, restored after; yields a list that holds,
    after the block, whether the block drew from them (``check``; else it stays empty: no copies of the states)."""
    key = hashlib.sha256(f"{seed}:{epoch}:".encode() + indices.detach().cpu().numpy().tobytes()).digest()
    devices = [device] if device.type == "cuda" else []
    drew: list[bool] = []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
        seeded = _states(devices) if check else None
        try:
            yield drew
        finally:  # before fork_rng puts the outer states back
            if seeded is not None:
                drew.append(not all(torch.equal(a, b) for a, b in zip(seeded, _states(devices), strict=True)))


def _states(devices: list[torch.device]) -> list[torch.Tensor]:
    return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


class GenericTask:
    """What the loop does with batches that are not images: see the module docstring."""

    kind = "generic"
    eval_prepared = False  # its eval loader is this rank's own block of the eval set, not accelerate's
    checked_classes = 0  # no [batch, num_classes] check of the outputs

    def __init__(
        self,
        classification: bool,
        scores: Scores,
        collate_fn: Callable | None = None,
        loss_fn: Callable | None = None,
        predict_fn: Callable | None = None,
        seed: int = 0,
    ):
        self.classification, self.scores, self.seed = classification, scores, seed
        self.collate_fn, self.loss_fn, self.predict_fn = collate_fn, loss_fn, predict_fn
        self.monitor, self.higher = scores.monitor, scores.higher
        self.loss_said: str | None = None  # which loss the first batch used, in words
        self.say: Callable[[str], None] = print  # the run's console (main process), set by ready()
        self._draws_checked = False

    # ---- batches ---------------------------------------------------------------------------------------
    def collate(self, samples: list) -> tuple[Any, torch.Tensor]:
        batch = (self.collate_fn or default_collate)(samples)
        if self.collate_fn is None:
            _refuse_lists(batch)
        return batch, labels_of(batch)

    def loaders(self, splits, micro: int, eval_batch: int, seed: int, global_batch: int, acc, workers: int, pin):
        """(train loader, this rank's eval loader): the training batches carry the samples' indices, and are read
        with the host's generators keyed on them; ``pin``: (train's, eval's) pin_memory."""
        train = make_loader(splits.train, micro, shuffle=True, with_indices=True, seed=seed, collate=self.collate,
                            drop_to_multiple_of=global_batch, num_workers=workers, pin_memory=pin[0],
                            keyed_seed=seed)  # fmt: skip
        n, rank, world = len(splits.test), acc.process_index, acc.num_processes
        block = Subset(splits.test, range(n * rank // world, n * (rank + 1) // world))
        if not len(block):  # fewer eval samples than processes: this rank scores none
            return train, []
        evals = make_loader(block, eval_batch, shuffle=False, seed=seed, collate=self.collate, num_workers=workers,
                            pin_memory=pin[1])  # fmt: skip
        return train, evals

    # ---- the train step --------------------------------------------------------------------------------
    def forward(self, features, model, batch, labels: torch.Tensor, indices: torch.Tensor, epoch: int):
        """``(outputs, loss)`` of one training micro-batch (randomness keyed on it)."""
        keys = features.dropout.batch(epoch, indices) if features.dropout is not None else nullcontext()
        check = not self._draws_checked  # the first step only: later ones do not copy the generators' states
        with keyed_rng(self.seed, epoch, indices, labels.device, check) as drew, keys:
            outputs = call(model, batch)
        if check:
            self._draws_checked = True
            if drew[0]:
                self.say(DRAWS_NOTE)
            if labels.dim() > 1 and self.classification and self.loss_fn is None:
                self.say(TOKENS_NOTE)
        return outputs, self.loss(outputs, batch, labels)

    def loss(self, outputs: Any, batch: Any, labels: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            loss, said = self.loss_fn(outputs, batch), f"loss_fn {getattr(self.loss_fn, '__name__', 'given')}"
        elif (own := _own_loss(outputs)) is not None:
            loss, said = own, "the model's own (outputs.loss)"
        elif self.classification:
            loss, said = _class_loss(output_tensor(outputs), labels, check=self.loss_said is None)
        else:
            loss, said = F.mse_loss(self._values(output_tensor(outputs), labels).float(), labels.float()), "mse"
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise UserError(f"{said} gave {type(loss).__name__} {getattr(loss, 'shape', '')}; it must be one number")
        self.loss_said = self.loss_said or said
        return loss.reshape(())

    @staticmethod
    def _values(values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A regression's output as its targets' shape (``[B, 1]`` against ``[B]``, or the reverse)."""
        if values.shape == labels.shape:
            return values
        if values.numel() != labels.numel():
            raise UserError(
                f"the model's output is {list(values.shape)} for targets {list(labels.shape)}: a regression (float "
                "labels) needs one value per target; for a classification make the labels integers (.long())"
            )
        return values.reshape(labels.shape)

    def predictions(self, outputs: Any, batch: Any, labels: torch.Tensor) -> torch.Tensor:
        """What the metrics score: ``predict_fn``'s, the argmax of the logits (a single logit: whether it is
        above 0), or the output values."""
        if self.predict_fn is not None:
            return torch.as_tensor(self.predict_fn(outputs, batch))
        values = output_tensor(outputs).detach()
        if self.classification:
            if values.dim() == labels.dim() + 1:
                return (values[..., 0] > 0).long() if values.shape[-1] == 1 else values.argmax(-1)
            return (values > 0).long()
        return self._values(values, labels).float()

    def counted(self, outputs: Any, labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(correct, labels counted) of a micro-batch for the train records: a classification's labelled samples
        or tokens (-100 left out), on the device; a regression's samples (0 correct)."""
        if not self.classification or self.predict_fn is not None:
            return labels.new_zeros((), dtype=torch.int64), labels.shape[0]
        predicted, counted = self.predictions(outputs, None, labels), labels != IGNORE
        if predicted.shape != labels.shape:
            return labels.new_zeros((), dtype=torch.int64), labels.shape[0]
        return ((predicted == labels) & counted).sum(), counted.sum()

    def train_values(self, loss: float, correct: float, seen: float) -> dict[str, float]:
        shown = {"loss": loss / max(seen, 1)}
        if self.classification and self.predict_fn is None:
            shown["accuracy"] = correct / max(seen, 1)
        return shown

    def ready(self, info, channels_last: bool, say: Callable[[str], None] = print) -> None:
        """The batches go to the model as they come: only the console for the notes of the first step."""
        self.say = say

    def probe_step(self, model, splits, micro: int, acc) -> None:
        """--max-device-batch auto: forward and backward of the ``micro`` largest of the first samples."""
        from accelerate.utils import send_to_device

        data = splits.train
        largest = sorted(range(min(len(data), PROBE_SCAN)), key=lambda i: -_numel(data[i]))
        samples = [data[largest[j % len(largest)]] for j in range(micro)]
        batch, labels = send_to_device(self.collate(samples), acc.device)
        with acc.autocast():
            outputs = call(model, batch)
        self.loss(outputs, batch, labels).backward()

    # ---- evaluation --------------------------------------------------------------------------------------
    def evaluate(self, acc, model, loader, with_confusion=False, tta="none", full_batches=False) -> dict[str, Any]:
        """eval_loss and the metrics over the whole eval set (each rank its block; gathered in order). eval_loss is
        the mean over the labelled values: each batch's loss weighted by its labels (-100 left out)."""
        from accelerate.utils import gather_object

        module = acc.unwrap_model(model)
        was_training = module.training
        module.eval()
        preds, refs, samples = [], [], 0
        loss_sum, weight = torch.zeros((), dtype=torch.float64, device=acc.device), 0
        with torch.no_grad():
            for batch, labels in loader:
                outputs, loss, batch, labels = self._eval_batch(acc, module, batch, labels)
                counted = int((labels != IGNORE).sum()) if self.classification else labels.numel()
                loss_sum += loss.double() * counted
                weight, samples = weight + counted, samples + labels.shape[0]
                pred, ref = scored(self.predictions(outputs, batch, labels), labels, self.classification)
                preds.append(pred)
                refs.append(ref)
        module.train(was_training)
        mine = (
            torch.cat(preds) if preds else None,
            torch.cat(refs) if refs else None,
            loss_sum.item(),
            weight,
            samples,
        )
        ranks = gather_object([mine]) if acc.num_processes > 1 else [mine]
        preds_all = torch.cat([r[0] for r in ranks if r[0] is not None])
        refs_all = torch.cat([r[1] for r in ranks if r[1] is not None])
        out: dict[str, Any] = {"eval_loss": sum(r[2] for r in ranks) / max(sum(r[3] for r in ranks), 1)}
        out.update(self.scores.compute(preds_all, refs_all))
        out["eval_samples"] = sum(r[4] for r in ranks)
        return out

    def _eval_batch(self, acc, module, batch, labels):
        from accelerate.utils import send_to_device

        batch, labels = send_to_device((batch, labels), acc.device)
        with acc.autocast():
            outputs = call(module, batch)
        return outputs, self.loss(outputs, batch, labels), batch, labels

    def check(self, acc, model, loader) -> None:
        """Before the run: one batch of this rank's eval block through the model, its predictions and the
        metrics, so that a monitor no metric gives, predictions that do not pair with the labels or a model
        without logits are refused now, in one line, not at the first evaluation."""
        import warnings

        if not loader:
            return
        module = acc.unwrap_model(model)
        was_training = module.training
        module.eval()
        batch, labels = next(iter(loader))
        with torch.no_grad(), torch.random.fork_rng(devices=[acc.device] if acc.device.type == "cuda" else []):
            outputs, _, batch, labels = self._eval_batch(acc, module, batch, labels)
        module.train(was_training)
        pred, ref = scored(self.predictions(outputs, batch, labels), labels, self.classification)
        with warnings.catch_warnings():  # a metric of a few samples may warn (an ill-defined R2, one class)
            warnings.simplefilter("ignore")
            self.scores.compute(pred, ref)
        self.loss_said = None  # the first training batch is checked again (labels against logits)

    # ---- records -----------------------------------------------------------------------------------------
    def write_results(self, out, confusion, class_names, plots: bool) -> None:
        """(No confusion matrix: the metrics are in metrics.jsonl and summary.json.)"""

    def summary(self, final: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in final.items() if k.startswith("eval_") and k != "eval_samples" and "_ema_" not in k}

    def best_note(self, best_step: int | None, best: float | None, final_step: int, folder) -> dict[str, str]:
        return best_note(best_step, best, final_step, folder, self.monitor, images=False)

    def result_line(self, summary: dict[str, Any]) -> str:
        keys = [self.monitor] + ["eval_loss"] * (self.monitor != "eval_loss")
        return " | ".join(f"{k} {summary[k]:.4f}" for k in keys if isinstance(summary.get(k), (int, float)))

    def record(self) -> dict[str, Any]:
        """What the run's config.yaml, checkpoints and config.json say of the task (a resume compares it)."""
        return {
            "task": "classification" if self.classification else "regression",
            "metrics": self.scores.names(),
            "monitor": self.monitor,
            "mode": "max" if self.higher else "min",
        }

    def describe(self) -> str:
        direction = "higher" if self.higher else "lower"
        return (
            f"{self.record()['task']} ({'integer' if self.classification else 'float'} labels); metrics "
            f"{', '.join(self.scores.keys()) or 'eval_loss'}; best/ and early stopping follow {self.monitor} "
            f"({direction} is better)"
        )

    def model_config(self, cfg, splits, pre=None) -> dict[str, Any]:
        """config.json of the export: the model's name, the task, and the classes when they are known."""
        info = splits.info
        classes = {"num_classes": info.num_classes, "class_names": info.class_names} if info.num_classes else {}
        return {"model": cfg.model, **classes, "dataset": cfg.dataset, **self.record()}


def _numel(sample: Any) -> int:
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    if isinstance(sample, Mapping):
        return sum(_numel(v) for v in sample.values())
    if isinstance(sample, (tuple, list)):
        return sum(_numel(v) for v in sample)
    return 1
