"""``accel_train.train``'s datasets for the generic task: which task they are, their splits and their identity.

A run trains on the generic task (:mod:`accel_train.tasks.generic`) when it is given ``collate_fn``, ``loss_fn``,
``metrics``, ``predict_fn`` or ``monitor``, or when its samples are not images with class labels: a dict with no
image key (``{"input_ids": ..., "label": ...}``), inputs that are not images (a vector of features), or float
targets (a regression). The data's identity (a resume on changed data is refused, as for images) is a
``datasets.Dataset``'s fingerprint and Arrow files, or a hash of every sample (up to ``MAX_HASHED`` of them,
evenly spaced beyond that).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset, TensorDataset

from accel_train.data.base import DatasetInfo, DataSplits
from accel_train.data.identity import Identity, Part, _hasher, hf_part
from accel_train.data.pipeline import seeded_from
from accel_train.errors import UserError
from accel_train.tasks.batches import LABEL_KEYS

IMAGE_KEYS = ("image", "img", "pixel_values")
TASK_OPTIONS = ("collate_fn", "loss_fn", "metrics", "predict_fn", "monitor", "monitor_mode")
MAX_HASHED = 200_000
DRAWS_NOTE = (
    "accel_train: note: {} reads other values each time (its own generator, os.urandom: what accel_train cannot "
    "seed): a resume cannot check that its data is the same, and draws other numbers than a straight run"
)
MIN_SIDE = 8  # pixels: an input with a shorter side is not an image


def _sample_label(sample: Any) -> Any:
    if isinstance(sample, Mapping):
        return next((sample[k] for k in (*LABEL_KEYS, "fine_label") if k in sample), None)
    return sample[-1] if isinstance(sample, (tuple, list)) and len(sample) >= 2 else None


def is_float_label(label: Any) -> bool:
    if isinstance(label, torch.Tensor):
        return label.is_floating_point()
    if isinstance(label, np.ndarray):
        return np.issubdtype(label.dtype, np.floating)
    return isinstance(label, (float, np.floating))


def wants_generic(sample: Any, options: Mapping[str, Any]) -> bool:
    """True when the first sample (or an option) says this is not an image classification."""
    if any(options.get(name) is not None for name in TASK_OPTIONS):
        return True
    if isinstance(sample, Mapping):
        return not any(k in sample for k in IMAGE_KEYS) or is_float_label(_sample_label(sample))
    if isinstance(sample, (tuple, list)) and len(sample) >= 2:
        inputs = sample[0]
        features = isinstance(inputs, (torch.Tensor, np.ndarray)) and not _image_like(inputs)
        return features or is_float_label(sample[-1])
    return False


def _image_like(inputs: torch.Tensor | np.ndarray) -> bool:
    """Whether an array can be an image: ``[C, H, W]`` or ``[H, W, C]`` with C of 1, 3 or 4; ``[H, W]`` of uint8,
    or of floats in [0, 1] with sides of ``MIN_SIDE`` or more. Anything else (a vector of features, token ids, a
    ``[12, 3]`` or standardised ``[16, 12]`` series) goes to the model as it is, never resized and normalised."""
    shape = tuple(inputs.shape)
    if len(shape) == 3:
        return shape[0] in (1, 3, 4) or shape[-1] in (1, 3, 4)
    if len(shape) != 2:
        return False
    if inputs.dtype in (torch.uint8, np.uint8):
        return True
    values = torch.as_tensor(inputs)
    return min(shape) >= MIN_SIDE and bool(values.min() >= 0) and bool(values.max() <= 1)


def _class_names(data: Any, classification: bool, class_names: list[str] | None) -> list[str]:
    """The classes when they are known without reading every sample (given, ``classes``, a label feature's names,
    a TensorDataset's labels); [] for a regression or when nothing says."""
    if not classification:
        return []
    if class_names is not None:
        return [str(c) for c in class_names]
    if isinstance(getattr(data, "classes", None), (list, tuple)):
        return [str(c) for c in data.classes]
    features = getattr(data, "features", None)
    for key in (*LABEL_KEYS, "fine_label"):
        names = getattr(features.get(key), "names", None) if isinstance(features, Mapping) else None
        if names:
            return list(names)
    labels = None
    if isinstance(data, TensorDataset):
        labels = data.tensors[-1].numpy()
    column = next((k for k in LABEL_KEYS if k in (getattr(data, "column_names", None) or ())), None)
    if column is not None:  # a datasets.Dataset's label column: read from Arrow, not sample by sample
        labels = np.asarray(data.with_format("numpy")[column])
    if labels is not None and labels.size and labels.ndim == 1 and labels.min() >= 0:
        return [str(i) for i in range(int(labels.max()) + 1)]
    return []


def generic_splits(train: Any, test: Any, cfg, class_names: list[str] | None, held_out) -> tuple[DataSplits, bool]:
    """(the splits, classification?) of the caller's datasets, as they are: each sample goes to the collate."""
    label = _sample_label(train[0])
    if label is None:
        raise UserError(
            "train_dataset[0] has no labels; samples must be dicts with a label "
            f"({', '.join(LABEL_KEYS)}) or (inputs, target) pairs"
        )
    classification = not is_float_label(label)
    if test is None:
        train, test = held_out(train, cfg.val_split, cfg.seed)
    if not hasattr(test, "__len__") or not hasattr(test, "__getitem__") or len(test) == 0:
        raise UserError("eval_dataset must be a non-empty map-style dataset (with __len__ and __getitem__)")
    names = _class_names(train.dataset if isinstance(train, Subset) else train, classification, class_names)
    info = DatasetInfo("custom", len(names), 0, 0, names, (), ())
    identity = Identity("samples", {"train": _part(train, names), "test": _part(test, names)})
    drawn = [name for name, part in identity.parts.items() if part.summary.get("draws")]
    notes = [DRAWS_NOTE.format(" and ".join(f"the {n} split" for n in drawn))] if drawn else []
    # every process must hold the same samples (a split drawn without a seed would differ): checked as files are
    extra = {"identity": identity, "index_digest": identity.digest, "data_kind": "samples", "notes": notes}
    return DataSplits(train, test, info, in_memory=False, extra=extra), classification


def _part(data: Any, names: list[str]) -> Part:
    """One split's identity: a ``datasets.Dataset``'s (its Arrow files, or its table's bytes when it is held in
    memory, where ``datasets`` may give each process its own random fingerprint), else a hash of its samples."""
    base = data.dataset if isinstance(data, Subset) else data
    if hasattr(base, "_fingerprint") and hasattr(base, "cache_files"):
        part = hf_part(base, names) if base.cache_files else _table_part(base)
        form = getattr(base, "format", None) or {}
        if form.get("type") == "custom":  # with_transform: what it returns too
            part = _joined(part, _samples_part(base))
        shown = repr((form.get("type"), form.get("columns"), form.get("output_all_columns"))).encode()
        part = Part(_hasher_of(part.digest.encode() + shown), {**part.summary, "format": repr(form.get("columns"))})
        if base is data:
            return part
        h = _hasher()
        h.update(part.digest.encode() + np.asarray(data.indices, dtype=np.int64).tobytes())
        return Part(h.hexdigest()[:16], {**part.summary, "rows": len(data)})
    return _samples_part(data)


def _samples_part(data: Any) -> Part:
    """A hash of the samples as the dataset returns them (up to ``MAX_HASHED``, evenly spaced), read with the
    host's generators seeded: a ``__getitem__`` that draws (random jitter) hashes the same on every process and
    attempt."""
    h, n = _hasher(), len(data)
    positions = range(n) if n <= MAX_HASHED else np.linspace(0, n - 1, MAX_HASHED).astype(np.int64).tolist()
    if _reads_differ(data, min(n, 4)):  # its own generator, os.urandom: no hash says what it holds
        return Part(f"draws{n}", {"rows": n, "hashed": 0, "draws": True})
    with seeded_from(b"accel_train identity"):
        for i in positions:
            _feed(h, data[int(i)])
    return Part(h.hexdigest()[:16], {"rows": n, "hashed": len(positions)})


def _reads_differ(data: Any, first: int) -> bool:
    """Whether the first samples read twice, with the host's generators seeded alike, hash differently."""
    digests = []
    for _ in range(2):
        h = _hasher()
        with seeded_from(b"accel_train identity"):
            for i in range(first):
                _feed(h, data[i])
        digests.append(h.hexdigest())
    return digests[0] != digests[1]


def _hasher_of(data: bytes) -> str:
    h = _hasher()
    h.update(data)
    return h.hexdigest()[:16]


def _joined(part: Part, samples: Part) -> Part:
    h = _hasher()
    h.update(f"{part.digest}:{samples.digest}".encode())
    return Part(h.hexdigest()[:16], {**part.summary, "transformed": samples.summary["hashed"]})


def _table_part(data: Any) -> Part:
    """An in-memory ``datasets.Dataset``: the bytes of its table's columns (and the rows it selects)."""
    h = _hasher()
    h.update(repr(data.column_names).encode())
    for batch in data.data.to_batches():
        for column in batch.columns:
            h.update(f"{column.type}:{column.offset}:{len(column)}".encode())
            for buffer in column.buffers():
                if buffer is not None:
                    h.update(memoryview(buffer))
    indices = getattr(data, "_indices", None)
    if indices is not None:
        for batch in indices.to_batches():
            for buffer in batch.columns[0].buffers():
                if buffer is not None:
                    h.update(memoryview(buffer))
    return Part(h.hexdigest()[:16], {"rows": len(data), "columns": list(data.column_names)})


def _feed(h, value: Any) -> None:
    """Every tensor's dtype, shape and bytes, every other value's repr, in order."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, Mapping):
        for key in value:
            h.update(f"\0{key}\0".encode())
            _feed(h, value[key])
    elif isinstance(value, (tuple, list)):
        h.update(f"\0{len(value)}[".encode())
        for item in value:
            _feed(h, item)
    else:
        h.update(repr(value).encode())
