"""The one contract every dataset honours.

Every builder returns :class:`DataSplits`. Samples are ``(image, label)`` with
``image`` a ``uint8`` tensor shaped ``[C, H, W]`` (already at ``info.image_size``)
and ``label`` an ``int``. Batches are ``(uint8 [B, C, H, W], int64 [B])``.
Conversion to float and normalisation happen once per batch on the training
device (:class:`accel_train.data.pipeline.BatchNormalizer`), never per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

from accel_train.data.augment import Augmented, KeyedAugment
from accel_train.data.settings import DataConfig  # noqa: F401  (re-exported: the builders import it here)


@dataclass
class DatasetInfo:
    name: str
    num_classes: int
    in_channels: int
    image_size: int
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass
class DataSplits:
    train: Dataset
    test: Dataset
    info: DatasetInfo
    in_memory: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def of_tensors(cls, train: tuple, test: tuple, info: DatasetInfo, transform=None, **extra) -> DataSplits:
        """Splits held in memory as uint8 ``(images, labels)`` tensors; ``transform`` augments training only."""
        return cls(TensorImageDataset(*train, transform=transform), TensorImageDataset(*test), info, True, extra)


class TensorImageDataset(Augmented, Dataset):
    """A whole split held as one ``uint8`` tensor (on the CPU, or moved once to the training device).

    ``__getitems__`` fetches a batch with one indexing op on the tensor's device instead of
    ``batch_size`` Python calls (airbench-style), while the sampler and Accelerate's sharding keep
    working unchanged. ``transform`` (optional) augments the whole batch at once: a
    :class:`~accel_train.data.augment.KeyedAugment` keyed on ``(augment_seed, epoch, index)``, so
    augmented batches are the same on any number of processes, on any device and after a mid-epoch
    resume (the loader's sampler passes each epoch on, see ``make_loader``). A per-sample callable is
    accepted too (wrapped in ``PerSampleAugment``: slow).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: KeyedAugment | Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)
        self._init_augment(transform)

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.labels.nbytes

    def to_device(self, device: torch.device) -> None:
        """Hold the split on ``device`` from now on: batches are indexed and augmented there."""
        self.images, self.labels = self.images.to(device), self.labels.to(device)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        images, labels = self.__getitems__([index + len(self) if index < 0 else index])
        return images[0], int(labels[0])

    def __getitems__(self, indices: Sequence[int]):
        idx = _index_tensor(indices, self.images.device)
        return self.augment(self.images.index_select(0, idx), idx), self.labels.index_select(0, idx)


def _index_tensor(indices: Sequence[int], device: torch.device) -> torch.Tensor:
    """The batch's indices on ``device``; to CUDA through pinned memory without blocking (no hidden sync)."""
    idx = torch.as_tensor(indices, dtype=torch.int64)
    if device.type == "cuda":
        return idx.pin_memory().to(device, non_blocking=True)
    return idx.to(device)


def collate_batch(batch):
    """Collate for both per-sample lists and batches pre-built by ``__getitems__``."""
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], torch.Tensor) and batch[0].dim() == 4:
        return batch
    images = torch.stack([torch.as_tensor(img) for img, _ in batch])
    labels = torch.tensor([int(lbl) for _, lbl in batch], dtype=torch.int64)
    return images, labels


def stratified_split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_idx, test_idx), both sorted: ``datasets``' stratified ``train_test_split(test_fraction, seed=seed)``
    (as ``digits`` splits), run on the labels alone: the same indices as that call, without building a table
    (0.2 s for a million labels instead of 50 s). Both are empty when no split exists (fewer test or train samples
    than classes, a class with one sample)."""
    import math

    import numpy as np
    from datasets.utils.stratify import stratified_shuffle_split_generate_indices

    empty = torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    n = len(labels)
    n_test = math.ceil(test_fraction * n)
    n_train = n - n_test
    if not 0 < test_fraction < 1 or n_test == 0 or n_train == 0:
        return empty
    _, codes = torch.unique(labels, return_inverse=True)
    rng = np.random.default_rng(seed)  # what train_test_split(seed=seed) draws from
    try:
        train, test = next(stratified_shuffle_split_generate_indices(codes.numpy(), n_train, n_test, rng=rng))
    except ValueError:
        return empty
    return torch.from_numpy(np.sort(np.asarray(train, dtype=np.int64))), torch.from_numpy(
        np.sort(np.asarray(test, dtype=np.int64))
    )
