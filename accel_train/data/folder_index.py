"""A folder of class subfolders as an index of its image files, listed with ``os.scandir`` at every launch.

Classes are the sorted names of the folder's non-hidden subfolders (as torchvision's ``ImageFolder``); each class
holds the image files anywhere below its subfolder (links to folders followed; a loop, or a folder reachable twice,
as a link into another class would make it, is refused), in sorted order. The index is numpy arrays (the relative
paths back to back as bytes, their offsets, the labels, each file's size and modification time): about 50 bytes a
file, shared by DataLoader workers without a copy. The file list is always what the folder holds now: what is
cached (``index_cache``: image sizes and modes, mean/std) is keyed by it, so a resume, a requeue, every other rank
and ``accel-evaluate`` read those facts instead of opening images again, and never facts of other files. Files
in the class folders that are not images by their extension are counted (:attr:`FolderIndex.skipped`), so that
the builder can say so. Nothing here opens an image: a bad image is found when it is first read, by
:class:`FileImageDataset`.
"""

from __future__ import annotations

import hashlib
import os
from array import array as int64s
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
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
STAT_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")  # the cache key, with the paths
SKIPPED_EXAMPLES = 3  # files that are not images, named per folder in the builder's line


@dataclass
class FolderIndex:
    """The image files of a folder of classes: ``path(i)`` and ``labels[i]`` for ``i < len(self)``.

    ``sizes``/``mtimes``: each file's size and modification time (ns) as listed; ``skipped``: files in the class
    folders that are not images by their extension, per extension (lower case), with a few examples."""

    root: Path
    classes: list[str]
    blob: np.ndarray  # uint8: the relative paths (os.fsencode) back to back
    offsets: np.ndarray  # int64 [n + 1]
    labels: np.ndarray  # int64 [n]
    sizes: np.ndarray | None = None  # int64 [n]
    mtimes: np.ndarray | None = None  # int64 [n]
    ctimes: np.ndarray | None = None  # int64 [n]: what no touch or cp -p sets back
    inodes: np.ndarray | None = None  # int64 [n]
    devices: np.ndarray | None = None  # int64 [n]
    cache: index_cache.Entry | None = None
    skipped: Counter = field(default_factory=Counter)
    skipped_examples: list[str] = field(default_factory=list)

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
        """What the index holds (classes, paths, labels, sizes) as a short hash: equal on two machines only when
        they see the same files (modification times left out: two copies of one folder differ in them)."""
        h = hashlib.sha256(b"\0".join(os.fsencode(c) for c in self.classes))
        for array in (self.offsets, self.blob, self.labels, self.sizes):
            if array is not None:
                h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()[:16]

    def counts(self) -> dict[str, int]:
        """How many images each class holds (every class subfolder, empty ones included)."""
        per_class = np.bincount(self.labels, minlength=len(self.classes))
        return {name: int(n) for name, n in zip(self.classes, per_class, strict=True)}


class _Scan:
    """One listing of a folder of classes, in bytes (any name works): each image file's path, size, modification
    and change time and inode, the files that are not images, and every folder's real path (a folder reachable
    twice is refused)."""

    def __init__(self, extensions: frozenset[str]):
        self.extensions = frozenset(os.fsencode(e) for e in extensions)
        self.files: list[bytes] = []
        self.fields = {name: int64s("q") for name in STAT_FIELDS}  # 8 bytes a file each, not a Python int
        self.skipped: Counter = Counter()
        self.skipped_examples: list[str] = []
        self.seen: dict[bytes, str] = {}  # real path -> the folder (relative) it was reached as

    def walk(self, top: bytes, rel: bytes) -> None:
        """Append the image files under ``top`` (relative paths, sorted)."""
        real = os.path.realpath(top)
        if real in self.seen:
            first, again = self.seen[real], os.fsdecode(rel)
            two = " under two classes" if first.split("/")[0] != again.split("/")[0] else ""
            raise UserError(
                f"{first!r} and {again!r} in {os.fsdecode(top[: len(top) - len(rel) - 1])} are one folder (one "
                f"links to the other): its images would be read twice{two}; remove the link, or copy the images"
            )
        self.seen[real] = os.fsdecode(rel)
        subdirs, images = [], []
        try:
            entries = list(os.scandir(top))
        except OSError as exc:
            raise UserError(f"cannot list {os.fsdecode(top)}: {exc.strerror or exc}; check its permissions") from None
        for entry in entries:
            name = entry.name
            if name[:1] == b".":
                continue
            if entry.is_dir():  # follows links, as torchvision's os.walk(followlinks=True)
                subdirs.append(name)
                continue
            dot = name.rfind(b".")
            ext = name[dot:].lower() if dot > 0 else b""
            if ext in self.extensions:
                images.append(entry)
            elif entry.is_file():
                self.skipped[os.fsdecode(ext) or "(no extension)"] += 1
                if len(self.skipped_examples) < SKIPPED_EXAMPLES:
                    self.skipped_examples.append(os.fsdecode(rel + b"/" + name))
        images.sort(key=attrgetter("name"))
        try:
            stats = [entry.stat() for entry in images]  # follows links: the file the index reads
        except OSError as exc:
            raise UserError(f"cannot read {os.fsdecode(exc.filename or top)}: {exc.strerror or exc}") from None
        for name, values in self.fields.items():
            values.extend([getattr(st, name) for st in stats])
        prefix = rel + b"/"
        self.files.extend([prefix + entry.name for entry in images])
        for name in sorted(subdirs):
            refuse_loop(os.fsdecode(top), os.fsdecode(name), os.fsdecode(real))
            self.walk(os.path.join(top, name), prefix + name)


def top_folders(root: Path, exclude: frozenset[str] = frozenset()) -> list[str]:
    """The sorted names of ``root``'s non-hidden subfolders (links followed), less those in ``exclude``."""
    try:
        return sorted(
            e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".") and e.name not in exclude
        )
    except OSError as exc:
        raise UserError(f"cannot list {root}: {exc.strerror or exc}; check its permissions") from None


def index_folder(root: Path, extensions: frozenset[str], exclude: frozenset[str] = frozenset()) -> FolderIndex:
    """The index of ``root`` as it is now (its class subfolders, less those named in ``exclude``), with the
    cache entry its facts are recorded in: keyed by every file's path, size, modification and change time and
    inode, so facts of other content are never read."""
    scan = _Scan(extensions)
    labels = []
    classes = top_folders(root, exclude)
    for label, name in enumerate(classes):
        before = len(scan.files)
        scan.walk(os.fsencode(str(root / name)), os.fsencode(name))
        labels.append(np.full(len(scan.files) - before, label, dtype=np.int64))
    blob, offsets = index_cache.join_blob(scan.files)
    label_array = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    fields = {name: np.frombuffer(values, dtype=np.int64) for name, values in scan.fields.items()}
    stamp = hashlib.sha256(b"\0".join(os.fsencode(c) for c in classes))
    for array in (blob, offsets, label_array, *fields.values()):
        stamp.update(array.tobytes())
    key = {"root": repr(str(root)), "extensions": sorted(extensions), "files": stamp.hexdigest()}  # repr: bytes
    entry = index_cache.load(INDEX_KIND, key, with_arrays=False)
    if entry is None:
        newest = int(fields["st_mtime_ns"].max()) if len(blob) else 0
        entry = index_cache.store(INDEX_KIND, key, {}, trusted=index_cache.settled(newest))
    index = FolderIndex(root, classes, blob, offsets, label_array, fields["st_size"], fields["st_mtime_ns"],
                        fields["st_ctime_ns"], fields["st_ino"], fields["st_dev"], entry, scan.skipped,
                        scan.skipped_examples)  # fmt: skip
    refuse_linked_twice(index)
    return index


def refuse_linked_twice(index: FolderIndex, other: FolderIndex | None = None, same_class: bool = False) -> None:
    """One file (hard links, or links to one file) under two classes of ``index`` (``same_class``: anywhere twice
    in it, for a folder split by ``--val-split``), or in ``index`` and ``other`` (the test split): its image would
    be trained on under two labels, or scored as a test image it trained on."""
    if other is None:
        groups = np.arange(len(index)) if same_class else index.labels
        inodes, devices = index.inodes, index.devices
    else:
        inodes, devices = np.concatenate([index.inodes, other.inodes]), np.concatenate([index.devices, other.devices])
        groups = np.repeat([0, 1], [len(index), len(other)])
    if inodes is None or len(inodes) < 2:
        return
    order = np.lexsort((inodes, devices))
    same = (inodes[order][1:] == inodes[order][:-1]) & (devices[order][1:] == devices[order][:-1])
    pairs = np.flatnonzero(same & (groups[order][1:] != groups[order][:-1]))
    if len(pairs) == 0:
        return
    a, b = sorted(int(order[pairs[0] + k]) for k in (0, 1))

    def name(i: int) -> str:
        if other is None:
            return index.relpath(i)
        return (
            f"{index.root.name}/{index.relpath(i)}"
            if i < len(index)
            else f"{other.root.name}/{other.relpath(i - len(index))}"
        )

    what = "the training and the test split" if other else "two places" if same_class else "two classes"
    raise UserError(
        f"{index.root}: {len(pairs)} file(s) are in {what} at once (hard links, or links to one file), e.g. "
        f"{name(a)!r} and {name(b)!r}: an image would be read under two labels, or scored as a test image it "
        "trained on; remove the links, or copy the images you mean"
    )


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
