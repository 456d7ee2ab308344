"""A folder of class subfolders as an index of its image files, made once with ``os.scandir`` and cached.

Classes are the sorted names of the folder's non-hidden subfolders (as torchvision's ``ImageFolder``); each class
holds the image files anywhere below its subfolder (links to folders followed, a loop refused), in sorted order.
The index is three numpy arrays (the relative paths back to back as bytes, their offsets, the labels): about 30
bytes a file, shared by DataLoader workers without a copy. It is cached (``index_cache``) keyed by the folder's
path and the modification times of every folder in it, so a resume, a requeue, every other rank and
``accel-evaluate`` read it instead of listing the files again. Nothing here opens an image: a bad image is found
when it is first read, by :class:`FileImageDataset`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from accel_train.data import index_cache
from accel_train.data.augment import Augmented
from accel_train.data.images import DECODE_ERRORS, open_image, refuse_loop
from accel_train.data.pixels import to_mode_and_size
from accel_train.errors import UserError

INDEX_KIND = "imagefolder"


@dataclass
class FolderIndex:
    """The image files of a folder of classes: ``path(i)`` and ``labels[i]`` for ``i < len(self)``."""

    root: Path
    classes: list[str]
    blob: np.ndarray  # uint8: the relative paths (os.fsencode) back to back
    offsets: np.ndarray  # int64 [n + 1]
    labels: np.ndarray  # int64 [n]
    cache: index_cache.Entry | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        return os.fsdecode(self.blob[self.offsets[i] : self.offsets[i + 1]].tobytes())

    def path(self, i: int) -> Path:
        return self.root / self.relpath(i)

    def path_str(self, i: int) -> str:
        """``str(path(i))`` without pathlib's parsing (the DataLoader's per-image cost)."""
        return os.path.join(self._root_str, self.relpath(i))

    @property
    def _root_str(self) -> str:
        return str(self.root)

    def digest(self) -> str:
        """What the index holds (classes, paths, labels) as a short hash: equal on two machines only when they
        see the same files."""
        h = hashlib.sha256("\0".join(self.classes).encode())
        for array in (self.offsets, self.blob, self.labels):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()[:16]

    def counts(self) -> dict[str, int]:
        """How many images each class holds (every class subfolder, empty ones included)."""
        per_class = np.bincount(self.labels, minlength=len(self.classes))
        return {name: int(n) for name, n in zip(self.classes, per_class, strict=True)}


def _walk(top: str, rel: str, extensions: frozenset[str], files: list[bytes], folders: list[str]) -> None:
    """Append the image files under ``top`` (relative paths, sorted) and every folder visited."""
    folders.append(rel)
    subdirs, names = [], []
    try:
        entries = list(os.scandir(top))
    except OSError as exc:
        raise UserError(f"cannot list {top}: {exc.strerror or exc}; check its permissions") from None
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        if entry.is_dir():  # follows links, as torchvision's os.walk(followlinks=True)
            subdirs.append(name)
        elif os.path.splitext(name)[1].lower() in extensions:
            names.append(name)
    prefix = rel + "/"
    files.extend(os.fsencode(prefix + name) for name in sorted(names))
    real = os.path.realpath(top)
    for name in sorted(subdirs):
        refuse_loop(top, name, real)
        _walk(os.path.join(top, name), prefix + name, extensions, files, folders)


def scan(root: Path, extensions: frozenset[str]) -> tuple[list[str], list[bytes], np.ndarray, list[str]]:
    """(classes, relative file paths, labels, folders) of ``root``, listed now."""
    try:
        top = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise UserError(f"cannot list {root}: {exc.strerror or exc}; check its permissions") from None
    files: list[bytes] = []
    folders: list[str] = ["."]
    labels = []
    for label, name in enumerate(top):
        before = len(files)
        _walk(str(root / name), name, extensions, files, folders)
        labels.append(np.full(len(files) - before, label, dtype=np.int64))
    return top, files, np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64), folders


def index_folder(root: Path, extensions: frozenset[str]) -> FolderIndex:
    """The index of ``root``: from the cache when no folder in it changed, else scanned now (and cached)."""
    key = {"root": str(root), "extensions": sorted(extensions)}
    entry = index_cache.load(INDEX_KIND, key, root)
    if entry is None:
        classes, files, labels, folders = scan(root, extensions)
        blob, offsets = index_cache.join_blob(files)
        classes_blob, classes_offsets = index_cache.join_blob([os.fsencode(c) for c in classes])
        arrays = {"blob": blob, "offsets": offsets, "labels": labels}
        arrays |= {"classes": classes_blob, "class_offsets": classes_offsets}
        entry = index_cache.store(INDEX_KIND, key, root, folders, arrays)
    a = entry.arrays
    classes = [os.fsdecode(a["classes"][a["class_offsets"][i] : a["class_offsets"][i + 1]].tobytes())
               for i in range(len(a["class_offsets"]) - 1)]  # fmt: skip
    return FolderIndex(root, classes, a["blob"], a["offsets"], a["labels"], entry)


def decode_file(path: str | Path, channels: int, size: int, out: np.ndarray | None = None) -> torch.Tensor:
    """One image file as uint8 [channels, size, size] (written into ``out``, a [channels, size, size] uint8 array,
    when given), oriented by its EXIF tag (as ``datasets`` reads it), converted and resized as ``image_to_chw``."""
    from PIL import ImageOps

    with open_image(path) as image:  # a regular file, within the pixel limit; one-line errors
        try:
            image.load()
            if image.getexif().get(0x0112) is not None:
                image = ImageOps.exif_transpose(image)
            pixels = np.asarray(to_mode_and_size(image, channels, size, path))
        except DECODE_ERRORS as exc:
            why = " ".join(str(exc).split())[:200]
            raise UserError(f"cannot decode image {path}: {why}; remove or replace it") from None
    chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    if out is None:
        return torch.from_numpy(np.ascontiguousarray(chw))
    np.copyto(out, chw)  # the one copy from PIL's buffer into the batch
    return torch.from_numpy(out)


class FileImageDataset(Augmented, Dataset):
    """Map-style view of some rows of a :class:`FolderIndex`: each image decoded when it is fetched.

    Samples are ``(uint8 [C, size, size], int label)``; ``__getitems__`` returns a whole batch, augmented at once by
    ``transform`` (keyed on the sample's index; in the DataLoader workers when there are some). ``rows``: which
    entries of the index (default: all); ``label_map``: the index's labels -> the model's classes.
    """

    def __init__(self, index: FolderIndex, channels: int, size: int, rows: np.ndarray | None = None,
                 label_map: dict[int, int] | None = None, transform=None):  # fmt: skip
        self.index, self.channels, self.size = index, channels, size
        self.rows = np.arange(len(index), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        labels = index.labels[self.rows]
        if label_map is not None:
            labels = np.asarray([label_map[int(v)] for v in labels], dtype=np.int64)
        self._labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        self._init_augment(transform)

    def __len__(self) -> int:
        return len(self.rows)

    def path(self, i: int) -> Path:
        return self.index.path(int(self.rows[i]))

    def __getitem__(self, index: int):
        images, labels = self.__getitems__([index + len(self) if index < 0 else index])
        return images[0], int(labels[0])

    def __getitems__(self, indices: Sequence[int]):
        images = torch.empty((len(indices), self.channels, self.size, self.size), dtype=torch.uint8)
        slots = images.numpy()
        for j, i in enumerate(indices):
            decode_file(self.index.path_str(int(self.rows[i])), self.channels, self.size, out=slots[j])
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.augment(images, idx), self._labels.index_select(0, idx)

    def labels(self) -> torch.Tensor:
        return self._labels
