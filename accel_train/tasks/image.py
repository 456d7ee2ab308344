"""Image classification, as the loop has always trained it: uint8 batches normalised on the device, cross-entropy
(label smoothing, mixup/cutmix: :mod:`accel_train.features`), accuracy counted exactly, a confusion matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from accel_train.data.pipeline import BatchNormalizer, make_loader
from accel_train.evaluation import best_note, evaluate_model
from accel_train.fsio import write_json_atomic
from accel_train.preprocess import describe_training_images
from accel_train.run_dir import CONFUSION_JSON, CONFUSION_PNG


class ImageTask:
    kind = "image"
    eval_prepared = True  # accelerate shards the eval loader; gather_for_metrics drops its padding
    monitor, higher = "eval_accuracy", True

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.checked_classes = num_classes  # the first forward's output must be [batch, num_classes]
        self.normalizer: BatchNormalizer | None = None  # set once channels_last is chosen (build._prepare)

    def loaders(self, splits, micro: int, eval_batch: int, seed: int, global_batch: int, acc, workers: int, pin):
        """(train loader with the samples' indices, eval loader); ``pin``: (train's, eval's) pin_memory."""
        train = make_loader(
            splits.train,
            micro,
            shuffle=True,
            with_indices=True,  # (images, labels, global sample indices): mixup and dropout are keyed on them
            seed=seed,
            drop_to_multiple_of=global_batch,
            num_workers=workers,
            pin_memory=pin[0],
        )
        evals = make_loader(splits.test, eval_batch, shuffle=False, seed=seed, num_workers=workers, pin_memory=pin[1])
        return train, evals

    def ready(self, info, channels_last: bool, say=None) -> None:
        """The batches' normalisation (the dataset's or the pretrained weights' mean/std), in the model's layout."""
        self.normalizer = BatchNormalizer(info.mean, info.std, channels_last)

    def check(self, acc, model, loader) -> None:
        """(Images: the data and the model were checked as they were built.)"""

    def forward(self, features, model, images, labels: torch.Tensor, indices: torch.Tensor, epoch: int):
        return features.forward(model, self.normalizer(images), labels, indices, epoch)

    @staticmethod
    def counted(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (logits.detach().argmax(dim=1) == labels).sum(), labels.shape[0]

    @staticmethod
    def train_values(loss: float, correct: float, seen: float) -> dict[str, float]:
        return {"loss": loss / max(seen, 1), "accuracy": correct / max(seen, 1)}

    def evaluate(self, acc, model, loader, with_confusion=False, tta="none", full_batches=False) -> dict[str, Any]:
        args = (loader, self.normalizer, None, self.num_classes)  # accuracy: an exact count
        return evaluate_model(acc, model, *args, with_confusion, tta=tta, full_batches=full_batches)

    @staticmethod
    def summary(final: dict[str, Any]) -> dict[str, Any]:
        return {"eval_accuracy": final["eval_accuracy"], "eval_loss": final["eval_loss"]}

    @staticmethod
    def best_note(best_step: int | None, best: float | None, final_step: int, folder: Path) -> dict[str, str]:
        return best_note(best_step, best, final_step, folder)

    @staticmethod
    def result_line(summary: dict[str, Any]) -> str:
        return f"eval_accuracy {summary['eval_accuracy']:.4f} | eval_loss {summary['eval_loss']:.4f}"

    @staticmethod
    def write_results(out: Path, confusion: torch.Tensor, class_names: list[str], plots: bool) -> None:
        """The run's confusion matrix: confusion.json, and its picture with --plots."""
        matrix = {"class_names": class_names, "matrix": confusion.tolist()}
        write_json_atomic(out / CONFUSION_JSON, matrix, "the confusion matrix")
        if plots:
            from accel_train.plots import plot_confusion_matrix

            plot_confusion_matrix(confusion.numpy(), class_names, out / CONFUSION_PNG)

    @staticmethod
    def record() -> None:
        return None

    @staticmethod
    def model_config(cfg, splits, pre=None) -> dict[str, Any]:
        """What an export's config.json needs to rebuild the model and its input normalisation."""
        info = splits.info
        return {
            "model": cfg.model,
            "num_classes": info.num_classes,
            "in_channels": info.in_channels,
            "image_size": info.image_size,
            "mean": list(info.mean),
            "std": list(info.std),
            "class_names": info.class_names,
            "dataset": cfg.dataset,
            "preprocess": describe_training_images(splits.train, cfg.dataset),  # what accel-predict does to images
            **(pre.record() if pre is not None else {}),  # the weights it started from: source, file, sha256
        }
