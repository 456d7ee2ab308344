"""The one contract every dataset honours.

Every builder returns :class:`DataSplits`. Samples are ``(image, label)`` with
``image`` a ``uint8`` tensor shaped ``[C, H, W]`` (already at ``info.image_size``)
and ``label`` an ``int``. Batches are ``(uint8 [B, C, H, W], int64 [B])``.
Conversion to float and normalisation happen once per batch on the training
device (:class:`accel_train.data.pipeline.BatchNormalizer`), never per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, make_dataclass

import torch
from torch.utils.data import Dataset

from accel_train.config import TrainConfig

#: The options dataset builders read. Declared once, in ``TrainConfig`` (flag, default, help);
#: ``DataConfig`` is that slice of it, so ``build_dataset`` needs no training config.
DATA_FIELDS = (
    "dataset",
    "data_dir",
    "download",
    "image_size",
    "seed",
    "val_split",
    "image_column",
    "label_column",
    "augment",
    "synthetic_size",
    "synthetic_test_size",
    "synthetic_channels",
    "synthetic_image_size",
    "synthetic_classes",
)
DataConfig = make_dataclass(
    "DataConfig",
    [(f.name, f.type, field(default=f.default)) for f in fields(TrainConfig) if f.name in DATA_FIELDS],
)
DataConfig.__module__ = __name__
DataConfig.__doc__ = "The slice of the training config that dataset builders read (see ``DATA_FIELDS``)."


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


class TensorImageDataset(Dataset):
    """A whole split held as one ``uint8`` tensor.

    ``__getitems__`` lets the DataLoader fetch a batch with one indexing op
    instead of ``batch_size`` Python calls (airbench-style), while the sampler
    and Accelerate's sharding keep working unchanged.
    ``transform`` (optional) is applied per sample on uint8 tensors, for
    augmentations whose parameters must differ between samples. Its randomness
    is drawn from ``(augment_seed, epoch, index)`` alone, so augmented batches
    are the same on any number of processes and after a mid-epoch resume
    (accelerate calls ``set_epoch`` on the dataset each epoch).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)
        self.transform = transform
        self.augment_seed = 0
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _augment(self, image: torch.Tensor, index: int) -> torch.Tensor:
        # torchvision draws from the global CPU generator: seed it per sample inside fork_rng, which restores it
        # after. Only the CPU generator: torch.manual_seed would also reseed every CUDA generator, which
        # fork_rng(devices=[]) does not protect (dropout on the GPU would repeat per sample seed).
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(
                ((self.augment_seed * 1_000_003 + self.epoch) * 10_000_019 + index) % (2**63)
            )
            return self.transform(image)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self._augment(image, int(index))
        return image, int(self.labels[index])

    def __getitems__(self, indices: Sequence[int]):
        idx = torch.as_tensor(indices, dtype=torch.long)
        images = self.images.index_select(0, idx)
        if self.transform is not None:
            images = torch.stack([self._augment(img, int(i)) for img, i in zip(images, indices, strict=True)])
        return images, self.labels.index_select(0, idx)


def collate_batch(batch):
    """Collate for both per-sample lists and batches pre-built by ``__getitems__``."""
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], torch.Tensor) and batch[0].dim() == 4:
        return batch
    images = torch.stack([torch.as_tensor(img) for img, _ in batch])
    labels = torch.tensor([int(lbl) for _, lbl in batch], dtype=torch.int64)
    return images, labels


def stratified_split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic stratified split: returns (train_idx, test_idx), both sorted."""
    gen = torch.Generator().manual_seed(seed)
    train_idx, test_idx = [], []
    for cls in torch.unique(labels).tolist():
        members = torch.nonzero(labels == cls, as_tuple=False).flatten()
        members = members[torch.randperm(len(members), generator=gen)]
        n_test = int(round(len(members) * test_fraction))
        test_idx.append(members[:n_test])
        train_idx.append(members[n_test:])
    return torch.cat(train_idx).sort().values, torch.cat(test_idx).sort().values
