"""From a dataset to batches on the training device.

* :func:`plan_batches` turns "global batch G on W processes" into a micro-batch
  and accumulation steps, so every setup takes the same optimizer steps on
  the same global batches.
* :class:`EpochSampler` draws the permutation from ``(seed, epoch)`` only and
  truncates each epoch to whole global batches; Accelerate shards its batches
  across processes, so 1 process x 32 and 2 processes x 16 see identical
  global batches. A dataset with an ``epoch_order(seed, epoch)`` (shards read
  lazily: an order that keeps reads local) gives the permutation itself.
* :func:`place_on_device` moves in-memory datasets that fit onto the
  accelerator once (``--data-on-device``), so batches are indexed and augmented
  there.
* :class:`BatchNormalizer` turns uint8 batches into normalised floats on the
  device, once per batch.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from accel_train.data.base import _index_tensor, collate_batch
from accel_train.errors import UserError


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int
    micro_batch: int
    accum_steps: int
    world_size: int

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch} = {self.micro_batch} per device x {self.accum_steps} accumulation "
            f"step(s) x {self.world_size} process(es)"
        )


def plan_batches(
    world_size: int,
    batch_size: int,
    grad_accum_steps: int = 1,
    global_batch_size: int | None = None,
    max_device_batch: int | None = None,
) -> BatchPlan:
    if global_batch_size is None:
        return BatchPlan(batch_size * world_size * grad_accum_steps, batch_size, grad_accum_steps, world_size)
    if global_batch_size % world_size:
        raise UserError(
            f"--global-batch-size {global_batch_size} is not divisible by the {world_size} processes; "
            f"use a multiple of {world_size}"
        )
    per_process = global_batch_size // world_size
    cap = min(max_device_batch or per_process, per_process)
    accum = math.ceil(per_process / cap)
    while per_process % accum:  # smallest accumulation whose micro-batch divides evenly
        accum += 1
    return BatchPlan(global_batch_size, per_process // accum, accum, world_size)


class EpochIndex(int):
    """A sample's index that knows its epoch (``EpochSampler(tag_epoch=True)``): a batch read keyed on its samples
    draws other numbers in every epoch."""

    epoch: int

    def __new__(cls, value: int, epoch: int):
        self = super().__new__(cls, value)
        self.epoch = epoch
        return self

    def __reduce__(self):  # to DataLoader workers
        return (EpochIndex, (int(self), self.epoch))


class EpochSampler(Sampler[int]):
    """Global sample order, a function of ``(seed, epoch)`` alone.

    ``shuffle=False`` keeps dataset order (evaluation). ``multiple_of`` drops
    the tail so every epoch holds whole global batches; the LR schedule and
    the data order then do not depend on the number of processes.
    ``on_epoch`` hears every ``set_epoch``: the dataset's augmentation is keyed
    on the same epoch as the order. (Accelerate reaches the sampler in every
    setup, but calls the dataset's own ``set_epoch`` only when it cannot find
    the sampler, which is never on several processes.) ``order``: the
    dataset's own ``epoch_order(seed, epoch)``, a permutation of
    ``range(num_samples)`` that replaces ``torch.randperm`` when shuffling; it
    too must depend on ``(seed, epoch)`` alone.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int = 0,
        shuffle: bool = True,
        multiple_of: int = 1,
        on_epoch: Callable[[int], None] | None = None,
        order: Callable[[int, int], torch.Tensor] | None = None,
        tag_epoch: bool = False,
    ):
        self.num_samples, self.tag_epoch = num_samples, tag_epoch
        self.seed = seed
        self.shuffle = shuffle
        self.length = (num_samples // multiple_of) * multiple_of
        self.epoch = 0
        self.on_epoch = on_epoch
        self.order = order

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.on_epoch is not None:
            self.on_epoch(epoch)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        if self.shuffle and self.order is not None:
            order = self.order(self.seed, self.epoch)
            if len(order) != self.num_samples:
                raise ValueError(f"epoch_order gave {len(order)} indices for {self.num_samples} samples")
        elif self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.num_samples, generator=gen)
        else:
            order = torch.arange(self.num_samples)
        if self.tag_epoch:
            return (EpochIndex(i, self.epoch) for i in order[: self.length].tolist())
        return iter(order[: self.length].tolist())


def make_loader(
    dataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    drop_to_multiple_of: int = 1,
    num_workers: int = 0,
    pin_memory: bool = False,
    with_indices: bool = False,
    collate: Callable = collate_batch,
    keyed_seed: int | None = None,
) -> DataLoader:
    """A DataLoader whose own generator keeps iterator creation off the global RNG.

    (A plain DataLoader draws its base seed from the global RNG each epoch,
    which would shift dropout after a mid-epoch resume.) ``with_indices``: batches are
    ``(images, labels, indices)``, see :class:`WithIndices`. ``collate``: a list of samples to
    ``(inputs, labels)`` (default: images; the generic task's collate: ``accel_train.tasks.generic``).
    ``keyed_seed`` (with ``with_indices``): each batch is read and collated with the host's generators seeded
    from ``(keyed_seed, the epoch, its samples' indices)``, so random draws in a dataset's ``__getitem__`` or a collate
    (random masking) are the same on any number of processes at the same micro-batch, and after a resume.
    """
    if len(dataset) < drop_to_multiple_of:
        raise UserError(
            f"the training split has {len(dataset)} samples, fewer than one global batch of "
            f"{drop_to_multiple_of}; lower the batch size"
        )
    on_epoch = getattr(dataset, "set_epoch", None)
    order = getattr(dataset, "epoch_order", None)  # shards: a shuffle that keeps reads local
    sampler = EpochSampler(
        len(dataset), seed=seed, shuffle=shuffle, multiple_of=drop_to_multiple_of, on_epoch=on_epoch, order=order,
        tag_epoch=keyed_seed is not None,
    )  # fmt: skip
    workers = dict(persistent_workers=True, prefetch_factor=4) if num_workers > 0 else {}
    return DataLoader(
        WithIndices(dataset, collate, keyed_seed) if with_indices else dataset,
        batch_sampler=BatchSampler(sampler, batch_size, drop_last=shuffle),
        collate_fn=_batch_as_built if with_indices else collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **workers,
    )


class WithIndices(Dataset):
    """``dataset``'s batches as ``(images, labels, indices)``, ``indices`` the samples' global indices in the
    dataset (``int64 [B]``, on the images' device).

    The training loader's batches carry them so that mixup and dropout can key their draws on the
    sample, whichever process and micro-batch it lands in (``accel_train.features``).
    """

    def __init__(self, dataset, collate: Callable = collate_batch, keyed_seed: int | None = None):
        self.dataset, self.collate, self.keyed_seed = dataset, collate, keyed_seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]):
        getitems = getattr(self.dataset, "__getitems__", None)
        epoch = getattr(indices[0], "epoch", None) if len(indices) else None
        key = f"{self.keyed_seed}:{epoch}:{[int(i) for i in indices]}".encode() if self.keyed_seed is not None else None
        with seeded_from(key) if key is not None else nullcontext():
            inputs, labels = self.collate(getitems(indices) if getitems else [self.dataset[i] for i in indices])
        return inputs, labels, _index_tensor(indices, labels.device)


def seed_of(key: bytes) -> int:
    """A generator seed (63 bits) as a hash of ``key``: the same on every process and attempt."""
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)


@contextmanager
def seeded_from(key: bytes):
    """torch's CPU generator, numpy's and Python's global ones seeded from ``key`` inside, put back after (CUDA's
    are left alone: reading data draws on the host)."""
    seed = seed_of(key)
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


def _batch_as_built(batch):
    return batch


def place_on_device(
    datasets: Sequence, device: torch.device, fraction: float, memory: tuple[int, int] | None = None
) -> list:
    """Move in-memory datasets to ``device`` once, in order, while they fit in ``fraction`` of its memory.

    Returns the datasets moved. Their batches are then indexed (and augmented) on the device, and
    Accelerate's per-batch copy to the device is a no-op. ``memory``: ``(free, total)`` bytes of
    ``device`` (default: asked from CUDA; other devices keep their data where it is, so on CPU
    nothing moves). Datasets without ``to_device`` (decoded lazily) stay on the host.
    """
    if fraction <= 0:
        return []
    if memory is None:
        if device.type != "cuda":
            return []
        memory = torch.cuda.mem_get_info(device)
    free, total = memory
    budget = min(int(fraction * total), free)
    moved = []
    for dataset in datasets:
        if not hasattr(dataset, "to_device") or dataset.nbytes > budget:
            continue
        dataset.to_device(device)
        budget -= dataset.nbytes
        moved.append(dataset)
    return moved


class BatchNormalizer:
    """uint8 ``[B, C, H, W]`` -> normalised float on the batch's device."""

    def __init__(self, mean, std, channels_last: bool = False):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        dev = images.device
        if dev not in self._cache:
            # fold /255 into the affine map: x * scale + shift
            scale = 1.0 / (255.0 * self.std)
            self._cache[dev] = (scale.to(dev), (-self.mean / self.std).to(dev))
        scale, shift = self._cache[dev]
        out = torch.addcmul(shift, images.to(torch.float32), scale)
        return out.contiguous(memory_format=self.memory_format)
