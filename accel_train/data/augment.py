"""Batched augmentation of uint8 ``[B, C, H, W]`` batches, keyed on ``(seed, epoch, sample index)``.

One call augments a whole batch with a few tensor ops on the batch's device (airbench's idea: no
per-sample Python in the hot loop). Every random parameter comes from :mod:`accel_train.keyed`, so
sample ``i`` of epoch ``e`` gets the same crop and flip on 1 or N processes, on CPU or CUDA, and
after a mid-epoch resume; the global RNG is never touched.

An augmentation is a :class:`KeyedAugment`: ``augment(images, indices, seed, epoch) -> images``,
where ``indices`` are the samples' global indices in the dataset (``int64 [B]``, on the images'
device). Datasets hold one as ``transform`` and key it through :class:`Augmented`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from accel_train.errors import UserError
from accel_train.keyed import keyed_bernoulli, keyed_bits, keyed_randint


class KeyedAugment:
    """Base class: a batched uint8 augmentation whose randomness is a function of ``(seed, epoch, index)``."""

    def __call__(self, images: torch.Tensor, indices: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class CropFlip(KeyedAugment):
    """``size`` x ``size`` random crop of the image padded by ``padding`` on each side (``mode``: ``constant``,
    zeros, or ``reflect``, mirrored without repeating the edge), then (``flip``) a horizontal flip with
    probability 1/2: torchvision's ``RandomCrop(size, padding, padding_mode=mode)`` + ``RandomHorizontalFlip``
    in distribution, done for the whole batch by one gather (a few ops on the batch's device)."""

    size: int
    padding: int
    flip: bool = True
    mode: str = "constant"

    def describe(self) -> str:
        mode = ", padding_mode=reflect" if self.mode == "reflect" else ""
        return f"random_crop({self.size}, padding={self.padding}{mode})" + ("+hflip" if self.flip else "")

    def __call__(self, images: torch.Tensor, indices: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
        batch, channels, height, width = images.shape
        span_y, span_x = height + 2 * self.padding - self.size + 1, width + 2 * self.padding - self.size + 1
        if span_y < 1 or span_x < 1:
            raise ValueError(f"{height}x{width} images padded by {self.padding} are smaller than {self.size}")
        if self.mode == "reflect" and self.padding >= min(height, width):
            raise ValueError(f"reflect padding {self.padding} needs images larger than that, got {height}x{width}")
        if batch == 0:
            return images.new_empty((0, channels, self.size, self.size))
        grid = torch.arange(self.size, device=images.device) - self.padding
        # source row/column of every output row/column, in unpadded coordinates (outside: the zero padding)
        rows = keyed_randint(seed, epoch, indices, span_y, stream="crop_y") + grid  # [B, size]
        cols = keyed_randint(seed, epoch, indices, span_x, stream="crop_x") + grid  # [B, size]
        if self.flip:
            cols = torch.where(keyed_bernoulli(seed, epoch, indices, 0.5, stream="hflip"), cols.flip(1), cols)
        if self.mode == "reflect":  # mirror the outside indices back in: -1 -> 1, height -> height - 2
            rows = torch.where(rows < 0, -rows, torch.where(rows >= height, 2 * (height - 1) - rows, rows))
            cols = torch.where(cols < 0, -cols, torch.where(cols >= width, 2 * (width - 1) - cols, cols))
        # the zero padding is one zero row and column appended to each image: every outside index points there
        rows = torch.where((rows >= 0) & (rows < height), rows, height)
        cols = torch.where((cols >= 0) & (cols < width), cols, width)
        framed = F.pad(images, (0, 1, 0, 1))
        source = rows[:, :, None] * (width + 1) + cols[:, None, :]  # [B, size, size] into the framed plane
        flat = source.view(batch, 1, -1).expand(batch, channels, -1)
        out = framed.reshape(batch, channels, -1).gather(2, flat)
        return out.view(batch, channels, self.size, self.size)


class PerSampleAugment(KeyedAugment):
    """Adapter for a per-sample ``image -> image`` callable that draws from torch's global CPU generator
    (a torchvision transform): each sample runs with that generator seeded from ``(seed, epoch, index)``
    inside ``fork_rng``, which restores it after. One Python call per sample on the CPU: slow; prefer a
    batched :class:`KeyedAugment`. Only the CPU generator is reseeded (``torch.manual_seed`` would also
    reseed every CUDA generator, which ``fork_rng(devices=[])`` does not restore)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        self.fn = fn

    def describe(self) -> str:
        return repr(self.fn)

    def __call__(self, images: torch.Tensor, indices: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
        if len(images) == 0:
            return images
        halves = keyed_bits(seed, epoch, indices.cpu(), 2, stream="per_sample").tolist()
        with torch.random.fork_rng(devices=[]):
            out = []
            for image, (hi, lo) in zip(images.cpu(), halves, strict=True):
                torch.default_generator.manual_seed(((hi & 0x7FFFFFFF) << 32) | lo)
                out.append(self.fn(image))
        return torch.stack(out).to(images.device)


def as_keyed(transform: KeyedAugment | Callable[[torch.Tensor], torch.Tensor] | None) -> KeyedAugment | None:
    """``transform`` as a :class:`KeyedAugment` (per-sample callables are wrapped in :class:`PerSampleAugment`)."""
    if transform is None or isinstance(transform, KeyedAugment):
        return transform
    return PerSampleAugment(transform)


def crop_flip(cfg, size: int, padding: int, flip: bool) -> tuple[CropFlip, str]:
    """The batched random crop (+ flip) and its description (recorded as ``resolved.augment`` in config.yaml).

    ``padding`` is the dataset's default; ``cfg.crop_padding`` (a ``DataConfig``) overrides it, and
    ``cfg.crop_padding_mode`` picks zeros or reflection.
    """
    padding = padding if cfg.crop_padding is None else cfg.crop_padding
    if cfg.crop_padding_mode == "reflect" and padding >= size:
        raise UserError(f"--crop-padding {padding} with reflect padding needs images larger than {padding} pixels")
    augment = CropFlip(size, padding, flip, cfg.crop_padding_mode)
    return augment, augment.describe()


def scaled_padding(base_padding: int, native: int, size: int) -> int:
    """A dataset's crop padding at its ``native`` side, scaled to images resized to ``size`` (at least 1)."""
    return max(1, round(base_padding * size / native))


def opt_in_crop(cfg, size: int, native: int = 28) -> tuple[CropFlip | None, str | None]:
    """``--augment`` for the MNIST-like sources (mnist, fashion_mnist, digits, synthetic), off unless asked: a
    random crop with MNIST's 2 pixels of padding at ``native`` size, scaled to ``size``, and no flip (a mirrored
    digit is another digit or none). ``(None, None)`` without ``--augment``."""
    if cfg.augment is not True:
        return None, None
    return crop_flip(cfg, size, scaled_padding(2, native, size), flip=False)


class Augmented:
    """Mixin for datasets with an optional :class:`KeyedAugment` in ``transform``.

    ``augment_seed`` (the run's seed, set by ``build``) and the epoch are the augmentation's key
    besides the sample index. An augmented dataset keeps its epoch in shared memory, so that
    DataLoader workers, persistent or not, forked or spawned, read the value ``set_epoch`` wrote in
    the main process (one file descriptor each: datasets without augmentation hold none).
    """

    transform: KeyedAugment | None

    def _init_augment(self, transform: KeyedAugment | Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.transform = as_keyed(transform)
        self.augment_seed = 0
        self._epoch = torch.zeros((), dtype=torch.int64)
        self._share_epoch()

    def _share_epoch(self) -> None:
        if self.transform is not None and not self._epoch.is_shared():
            self._epoch.share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._share_epoch()  # (an augmentation set after construction) before the loader starts its workers
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def augment(self, images: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """``images`` (uint8 ``[B, C, H, W]``) of the samples ``indices`` (``int64 [B]``, same device), augmented."""
        if self.transform is None:
            return images
        return self.transform(images, indices, self.augment_seed, self.epoch)
