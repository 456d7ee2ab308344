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

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Subset, default_collate

from accel_train.data.pipeline import make_loader
from accel_train.errors import UserError
from accel_train.evaluation import best_note
from accel_train.tasks.batches import (
    IGNORE,
    LABEL_KEYS,
    call,
    class_loss,
    draws,
    keyed_rng,
    labels_of,
    numel,
    output_tensor,
    own_loss,
    refuse_lists,
    scored,
)
from accel_train.tasks.scores import Scores

__all__ = ["IGNORE", "LABEL_KEYS", "GenericTask", "call", "keyed_rng", "labels_of", "output_tensor", "scored"]

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
PROBABILITY_NOTE = (
    "accel_train: note: the model's one output is between 0 and 1 on the first eval batch: it is scored as a logit "
    "(class 1 above 0); if it is a probability (a Sigmoid at the end), pass predict_fn=lambda out, batch: "
    "(out > 0.5).long()"
)
PROBABILITY_SEEN = 8  # outputs that must all lie in [0, 1] for the note (a fresh model's few logits may, by chance)
EVAL_DRAWS_NOTE = (
    "accel_train: note: the collate draws random numbers at evaluation too (random masking?): the eval figures "
    "then depend on how the eval set is batched, and differ between 1 and N processes"
)


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
        self._eval_head: list = []
        self._data_notes: list[str] = []

    # ---- batches ---------------------------------------------------------------------------------------
    def collate(self, samples: list) -> tuple[Any, torch.Tensor]:
        batch = (self.collate_fn or default_collate)(samples)
        if self.collate_fn is None:
            refuse_lists(batch)
        return batch, labels_of(batch)

    def loaders(self, splits, micro: int, eval_batch: int, seed: int, global_batch: int, acc, workers: int, pin):
        """(train loader, this rank's eval loader): the training batches carry the samples' indices, and are read
        with the host's generators keyed on them; ``pin``: (train's, eval's) pin_memory."""
        train = make_loader(splits.train, micro, shuffle=True, with_indices=True, seed=seed, collate=self.collate,
                            drop_to_multiple_of=global_batch, num_workers=workers, pin_memory=pin[0],
                            keyed_seed=seed)  # fmt: skip
        n, rank, world = len(splits.test), acc.process_index, acc.num_processes
        block = Subset(splits.test, range(n * rank // world, n * (rank + 1) // world))
        self._data_notes = splits.extra.get("notes") or []  # said by ready(), once there is a console
        self._eval_head = [splits.test[i] for i in range(min(n, 2))]  # the check's batch where the block is empty
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
            self._count_classes(outputs, labels)
        return outputs, self.loss(outputs, batch, labels)

    def loss(self, outputs: Any, batch: Any, labels: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            loss, said = self.loss_fn(outputs, batch), f"loss_fn {getattr(self.loss_fn, '__name__', 'given')}"
        elif (own := own_loss(outputs)) is not None:
            loss, said = own, "the model's own (outputs.loss)"
        elif self.classification:
            loss, said = class_loss(output_tensor(outputs), labels, check=self.loss_said is None)
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
        """The batches go to the model as they come: only the console, for the notes (the data's, then the first
        step's)."""
        self.say = say
        for note in self._data_notes:
            say(note)

    def probe_step(self, model, splits, micro: int, acc) -> None:
        """--max-device-batch auto: forward and backward of the ``micro`` largest of the first samples."""
        from accelerate.utils import send_to_device

        data = splits.train
        largest = sorted(range(min(len(data), PROBE_SCAN)), key=lambda i: -numel(data[i]))
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
        """Before the run: one batch of this rank's eval block (the eval set's first samples where the block is
        empty: every rank refuses alike) through the model, its predictions and the metrics, so that a monitor no
        metric gives, predictions that do not pair with the labels or a model without logits are refused now, in
        one line, not at the first evaluation."""
        import warnings

        module = acc.unwrap_model(model)
        was_training = module.training
        module.eval()
        batch, labels = next(iter(loader)) if loader else self.collate(self._eval_head)
        with torch.no_grad(), torch.random.fork_rng(devices=[acc.device] if acc.device.type == "cuda" else []):
            outputs, _, batch, labels = self._eval_batch(acc, module, batch, labels)
        module.train(was_training)
        self._count_classes(outputs, labels)
        pred, ref = scored(self.predictions(outputs, batch, labels), labels, self.classification)
        with warnings.catch_warnings():  # a metric of a few samples may warn (an ill-defined R2, one class)
            warnings.simplefilter("ignore")
            self.scores.compute(pred, ref)
        self.loss_said = None  # the first training batch is checked again (labels against logits)
        self._notes(outputs, labels)

    def _count_classes(self, outputs: Any, labels: torch.Tensor) -> None:
        """The run's classes include every logit the model has (a class its training split lacks included): f1,
        precision and recall average over all of them, on every rank alike."""
        if not self.classification or self.predict_fn is not None:
            return
        logits = output_tensor(outputs)
        if logits.dim() == labels.dim() + 1 and logits.shape[-1] > 1:
            self.scores.num_classes = max(self.scores.num_classes, logits.shape[-1])

    def _notes(self, outputs: Any, labels: torch.Tensor) -> None:
        """What the check batch shows that a run would otherwise get wrong without a word."""
        if self.classification and self.predict_fn is None:
            values = output_tensor(outputs)
            one = values.dim() == labels.dim() + 1 and values.shape[-1] == 1
            if one and values.numel() >= PROBABILITY_SEEN and bool(((values >= 0) & (values <= 1)).all()):
                self.say(PROBABILITY_NOTE)
        if self._eval_head and draws(self.collate, self._eval_head):
            self.say(EVAL_DRAWS_NOTE)

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
            "loss_fn": _named(self.loss_fn),  # eval_loss is its value: another loss scores the run otherwise
            "predict_fn": _named(self.predict_fn),
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


def _named(fn: Callable | None) -> str | None:
    """A function's name as a record holds it (``module.qualname``; an object's class), None when not given."""
    if fn is None:
        return None
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}.{name}"
