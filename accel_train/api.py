"""``accel_train.train(model, train_dataset, eval_dataset, **options)``: your module and data, the same loop.

Example (``examples/train_your_model.py``)::

    import accel_train
    accel_train.train(MyNet, my_train_set, my_test_set, epochs=3, output_dir="runs/mine")

The same script runs on one CPU (``python my_script.py``) and under ``accelerate launch`` on any
setup: every process calls ``train`` and they join into one run. The options are the training
script's flags with ``_`` for ``-`` (``TrainConfig``'s fields); ``config="file.yaml"`` reads a YAML
file first, as ``--config`` does.

``model``: a model name as ``--model`` takes it (``"lenet"``, ``"tv:resnet50"``, ``"pkg.mod:build"``);
a class or function called as ``model(num_classes=, in_channels=, image_size=)`` (its initialisation
then follows ``seed``, the same on any number of processes); or an ``nn.Module`` instance (every
process uses rank 0's initial weights). Without datasets, ``dataset=`` names one as ``--dataset`` does. Without
a model, your data (or any but the built-in datasets) trains ``small_cnn_gn`` for 500 steps or more
(``accel_train/defaults.py``).

Datasets: any ``torch.utils.data.Dataset`` of ``(image, label)`` pairs, or of dicts with an image and
a label (a Hugging Face ``datasets.Dataset`` is one). Images may be PIL images, uint8 arrays or
tensors, or floats in [0, 1] (``ToTensor()``), as [C, H, W], [H, W, C] or [H, W]; they become uint8
[C, S, S] and each batch is normalised on the device with the training set's mean/std, so leave
``Normalize`` out. Labels are class indices. Without ``eval_dataset``, ``val_split`` of the training
set is held out.

Any task (text, regression, ...; ``docs/tasks.md``, :mod:`accel_train.tasks`): samples that are not images with
class labels (a dict without an image key, feature vectors, float targets), or any of ``collate_fn``,
``loss_fn``, ``metrics``, ``predict_fn``, ``monitor``, ``monitor_mode``, train your ``nn.Module`` (or a class or
function called with no arguments, seeded) on the batches as they come: ``model(**batch)`` for a dict,
``model(inputs)`` for ``(inputs, target)``; the loss is ``loss_fn(outputs, batch)``, the model's own
``outputs.loss``, or cross-entropy / MSE; ``metrics`` are ``evaluate`` names or callables, logged as
``eval_<name>``; best/ and early stopping follow ``monitor``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from accel_train.config import TrainConfig
from accel_train.data import folder
from accel_train.data.base import DatasetInfo, DataSplits, TensorImageDataset
from accel_train.errors import UserError
from accel_train.flags import field_type, is_parsed_text
from accel_train.tasks import GenericTask
from accel_train.tasks.data import generic_splits, wants_generic
from accel_train.tasks.scores import Scores

DATASET_LABEL = "custom"  # cfg.dataset of a run on data given to train()
IMAGE_KEYS = ("image", "img", "pixel_values")
LABEL_KEYS = ("label", "labels", "target", "fine_label")
STATS_SAMPLE = 512  # samples read for the mean/std
MAX_LABEL_SCAN = 200_000  # samples whose labels are read to count the classes, when nothing says how many

__all__ = ["train"]


def train(
    model: Any = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    *,
    class_names: list[str] | None = None,
    collate_fn: Callable | None = None,
    loss_fn: Callable | None = None,
    metrics: Any = None,
    predict_fn: Callable | None = None,
    monitor: str | None = None,
    monitor_mode: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Train ``model`` on ``train_dataset`` with accel_train's loop; returns the run summary.

    Under ``accelerate launch`` every process returns it (the same figures; accel_train itself prints its
    summary line once): print or save it on one, e.g. ``if os.environ.get("RANK", "0") == "0": print(summary)``.
    A SIGTERM or SIGINT stops the run at a step boundary with a checkpoint, then ends the script with exit code
    143 or 130 (``SystemExit``), as the signal would have: the scheduler sees it; ``resume="auto"`` continues.

    See the module docstring for what ``model`` and the datasets may be. ``class_names``: names of the
    classes (default: the dataset's ``classes``, or its label feature's names, or the indices). The other
    keywords take any model on any task (text, regression): see "Any task" in the module docstring.
    """
    values = _options(options)
    task_options = dict(collate_fn=collate_fn, loss_fn=loss_fn, metrics=metrics, predict_fn=predict_fn,
                        monitor=monitor, monitor_mode=monitor_mode)  # fmt: skip
    generic = train_dataset is not None and _has_first(train_dataset) and wants_generic(train_dataset[0], task_options)
    if train_dataset is None and any(v is not None for v in task_options.values()):
        raise UserError(f"train() got {', '.join(k for k, v in task_options.items() if v is not None)} without "
                        "train_dataset; they score your own datasets")  # fmt: skip
    model_instance = None
    if model is not None:
        values["model"], model_instance = _model_spec(model, built_here=generic)
    elif generic:
        raise UserError("train() on data that is not images with class labels needs your model: train(model, ...)")
    if train_dataset is None and eval_dataset is not None:
        raise UserError("train() got eval_dataset without train_dataset; pass both (or dataset='NAME')")
    if train_dataset is not None:
        if "dataset" in options:
            raise UserError("train() got both train_dataset and dataset=; pass one of them")
        _register_placeholder()
        values["dataset"] = DATASET_LABEL
    cfg = TrainConfig(**values).validate(given=values)  # what the caller set: a resume restores the rest
    from accel_train.loop import fit  # heavy imports only once the options are known to be good

    if generic:
        splits, classification = generic_splits(train_dataset, eval_dataset, cfg, class_names, _held_out)
        shipped = metrics if metrics is not None else ["accuracy"] * classification
        scores = Scores(shipped, monitor, monitor_mode, num_classes=splits.info.num_classes)
        task = GenericTask(classification, scores, collate_fn, loss_fn, predict_fn, cfg.seed)
        summary = fit(cfg, model=model_instance or _built(model, cfg.seed), splits=splits, task=task)
    else:
        splits = None if train_dataset is None else _splits(train_dataset, eval_dataset, cfg, class_names)
        summary = fit(cfg, model=model_instance, splits=splits)
    if summary.get("exit_code"):  # SIGTERM/SIGINT: stopped at a step boundary, checkpoint saved
        raise SystemExit(summary["exit_code"])  # 143/130, as the signal would: a scheduler sees it and requeues
    return summary


# --------------------------------------------------------------------------- options and model


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """``config=`` YAML values, then the options, each checked against its TrainConfig field's type."""
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    values: dict[str, Any] = {}
    if "config" in options:
        from accel_train.config_yaml import load_yaml_config

        values.update(load_yaml_config(options.pop("config"), TrainConfig))
    for name, value in options.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"train() got an unknown option {name!r}{hint}; the options are the flags of train.py")
        values[name] = _typed(name, value, known[name])
    return values


def _typed(name: str, value: Any, f: dataclasses.Field) -> Any:
    typ = field_type(f)
    if value is None and "None" in str(f.type):
        return None
    if is_parsed_text(f, value):  # text the flag itself takes: max_device_batch="auto"
        return value
    ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise UserError(f"train() option {name} must be {typ.__name__}, got {value!r:.80}")
    return value


def _has_first(data: Any) -> bool:
    return hasattr(data, "__len__") and hasattr(data, "__getitem__") and len(data) > 0


def _built(model: Any, seed: int) -> nn.Module:
    """The generic task's model from a class or function called with no arguments, seeded (the same on every
    process); its sizes are the caller's to choose (the loop knows no image shape to pass)."""
    torch.manual_seed(seed)
    built = model()
    if not isinstance(built, nn.Module):
        raise UserError(f"train() model {getattr(model, '__name__', model)!r} returned a {type(built).__name__}, "
                        "not an nn.Module")  # fmt: skip
    return built


def _model_spec(model: Any, built_here: bool = False) -> tuple[str, nn.Module | None]:
    """(what ``cfg.model`` records, the instance to train or None when ``create_model`` builds it, or
    ``built_here``: the generic task's model, built by ``_built``)."""
    from accel_train.models import register_model
    from accel_train.models.user import instance_label, spec_of

    if isinstance(model, str):
        if built_here:
            raise UserError(f"train() model {model!r}: a model name builds an image classifier; this data is not "
                            "images with class labels: pass your nn.Module (or a class building one)")  # fmt: skip
        return model, None
    if isinstance(model, nn.Module):
        return instance_label(model), model  # config.json says so: no config can rebuild an object
    if callable(model):
        spec = spec_of(model)  # importable by name: config.json can rebuild it (with the caller's opt-in)
        if spec is None:
            spec = f"{getattr(model, '__module__', None) or '__main__'}:{getattr(model, '__name__', 'model')}"
            register_model(spec, model)  # e.g. a class in the script itself: built by create_model, seeded
        return spec, None
    raise UserError(
        f"train() model must be a model name, a class or function building an nn.Module, or an nn.Module; "
        f"got a {type(model).__name__}"
    )


def _register_placeholder() -> None:
    """``cfg.dataset`` names data only this call holds: the name passes validation, building it says why not."""
    from accel_train.data import register_dataset

    def _given_to_train(cfg):
        raise UserError(
            f"dataset {DATASET_LABEL!r} is the data a script gave to accel_train.train(); run that script again, "
            "or pass --dataset NAME"
        )

    register_dataset(DATASET_LABEL, _given_to_train)


# --------------------------------------------------------------------------- datasets


def _pair(sample: Any, where: str) -> tuple[Any, Any]:
    """(image, label) of one sample: a pair, or a dict with an image key and a label key."""
    if isinstance(sample, dict):
        image = next((k for k in IMAGE_KEYS if k in sample), None)
        label = next((k for k in LABEL_KEYS if k in sample), None)
        if image is None or label is None:
            raise UserError(
                f"{where} is a dict with keys {sorted(sample)[:8]}; it needs an image ({', '.join(IMAGE_KEYS)}) "
                f"and a label ({', '.join(LABEL_KEYS)})"
            )
        return sample[image], sample[label]
    if isinstance(sample, (tuple, list)) and len(sample) >= 2:
        return sample[0], sample[1]
    raise UserError(f"{where} is a {type(sample).__name__}; return (image, label) pairs or dicts with both")


def _array(image: Any, where: str) -> Any:
    """A tensor as a numpy array; floats must be in [0, 1] (or 0..255): normalised floats are refused."""
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    if isinstance(image, np.ndarray) and np.issubdtype(image.dtype, np.floating) and image.size:
        if float(np.nanmin(image)) < 0:
            raise UserError(
                f"{where} holds negative values (normalised?); return images in [0, 1] or uint8 and drop "
                "Normalize: accel_train normalises each batch with the training set's mean/std"
            )
    return image


def _label(value: Any, where: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (np.integer, np.ndarray)) and np.size(value) == 1:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{where} has label {value!r:.40}; labels must be class indices 0, 1, 2, ...")
    return value


class _Samples(Dataset):
    """The caller's dataset as the loop's contract: ``(uint8 [channels, size, size], int)`` per sample."""

    def __init__(self, data: Any, channels: int, size: int, name: str):
        self.data, self.channels, self.size, self.name = data, channels, size, name

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        where = f"{self.name}[{index}]"
        image, label = _pair(self.data[int(index)], where)
        return folder.image_to_chw(_array(image, where), self.channels, self.size), _label(label, where)


def _tensors(data: TensorDataset, channels: int, size: int, name: str) -> TensorImageDataset:
    """A ``TensorDataset(images, labels)`` converted at once and held in memory (batches are one index op)."""
    images, labels = data.tensors[0], data.tensors[1]
    if images.dim() == 3:
        images = images[:, None]
    converted = folder.images_to_nchw(_array(images, f"{name} images"), channels, size)
    return TensorImageDataset(converted, torch.as_tensor(labels).long().flatten())


def _known_labels(data: Any) -> torch.Tensor | None:
    """All labels when the dataset holds them apart from its images (nothing is decoded)."""
    if isinstance(data, TensorDataset):
        return data.tensors[1].long().flatten()
    targets = getattr(data, "targets", None)
    if targets is not None:
        return torch.as_tensor(np.asarray(targets)).long().flatten()
    return None


def _names(data: Any, class_names: list[str] | None, wrapped: Dataset, name: str) -> list[str]:
    """The class names: given, the dataset's ``classes``, its label feature's names, or 0..K-1 from the labels."""
    if class_names is not None:
        return [str(c) for c in class_names]
    if isinstance(getattr(data, "classes", None), (list, tuple)):
        return [str(c) for c in data.classes]
    features = getattr(data, "features", None)
    for key in LABEL_KEYS:
        names = getattr(features.get(key), "names", None) if isinstance(features, dict) else None
        if names:
            return list(names)
    labels = _known_labels(data)
    if labels is None:
        if len(wrapped) > MAX_LABEL_SCAN:
            raise UserError(f"{name} has {len(wrapped):,} samples and no classes attribute; pass class_names=[...]")
        labels = torch.tensor([wrapped[i][1] for i in range(len(wrapped))])
    if labels.numel() == 0 or labels.min() < 0:
        raise UserError(f"{name} labels must be class indices 0, 1, 2, ...; pass class_names=[...] to name them")
    return [str(i) for i in range(int(labels.max()) + 1)]


def _wrap(data: Any, channels: int, size: int, name: str) -> Dataset:
    if isinstance(data, TensorImageDataset):
        return data
    if isinstance(data, TensorDataset) and len(data.tensors) >= 2:
        return _tensors(data, channels, size, name)
    return _Samples(data, channels, size, name)


def _held_out(data: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """A seeded random ``fraction`` of ``data`` for evaluation, the rest for training."""
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(len(data) * fraction))
    if n_test >= len(data):
        raise UserError(f"val_split={fraction} leaves no training samples of {len(data)}; lower it")
    train_idx, test_idx = order[n_test:].sort().values, order[:n_test].sort().values
    if isinstance(data, TensorImageDataset):  # stays in memory
        return tuple(TensorImageDataset(data.images[i], data.labels[i]) for i in (train_idx, test_idx))
    return Subset(data, train_idx.tolist()), Subset(data, test_idx.tolist())


def _splits(train_data: Any, eval_data: Any, cfg: TrainConfig, class_names: list[str] | None) -> DataSplits:
    """The loop's ``DataSplits`` of the caller's datasets: channels and size from the first image."""
    if not hasattr(train_data, "__len__") or not hasattr(train_data, "__getitem__") or len(train_data) == 0:
        raise UserError("train_dataset must be a non-empty map-style dataset (with __len__ and __getitem__)")
    first, _ = _pair(train_data[0], "train_dataset[0]")
    first = _array(first, "train_dataset[0]")
    channels = folder.infer_channels(first)
    size = folder.choose_image_size({folder.image_size_of(first)}, cfg.image_size)
    train_ds = _wrap(train_data, channels, size, "train_dataset")
    if eval_data is None:
        train_ds, test_ds = _held_out(train_ds, cfg.val_split, cfg.seed)
    else:
        test_ds = _wrap(eval_data, channels, size, "eval_dataset")
    names = _names(train_data, class_names, train_ds, "train_dataset")
    if len(names) < 2:
        raise UserError(f"train_dataset has {len(names)} class; a classifier needs at least 2")
    sample = torch.stack([train_ds[i][0] for i in folder.sample_indices(len(train_ds), STATS_SAMPLE)])
    mean, std = folder.channel_stats(sample)
    info = DatasetInfo(DATASET_LABEL, len(names), channels, size, names, mean, std)
    in_memory = isinstance(train_ds, TensorImageDataset) and isinstance(test_ds, TensorImageDataset)
    return DataSplits(train_ds, test_ds, info, in_memory=in_memory)
