"""``shards:<path>``: image classification data in shards, read as it is needed: more than fits in memory.

A folder of ``*.parquet`` files (pyarrow; Hugging Face's own layout), of ``*.arrow`` files (a ``save_to_disk``
folder, memory-mapped) or of ``*.tar`` files in WebDataset layout (``KEY.png``/``.jpg``/``.webp``/... plus
``KEY.cls`` holding the class as text). Splits: ``train/`` plus ``test/`` (or ``val/``, ``validation/``) subfolders
(as ``DatasetDict.save_to_disk`` writes them); or files named as on the Hub (``train-00000-of-00004.parquet``,
``test-...``, ``validation-...``; other splits are left out), directly in the folder or in its ``data/``; else every
shard is training data and ``val_split`` of its rows is held out, stratified by class, chosen by ``seed``.

The shards are indexed once (``shard_index``: row counts and row groups from the Parquet footers, one pass over
each tar's headers, the labels) and the index is cached, so a resume, a requeue or another rank starts without a
pass over the data. :class:`ShardDataset` is map-style: a sample is read where it lies (a Parquet row group's image
column, read whole, or an Arrow record batch, and kept in a small per-process LRU; a tar member, read with one
``pread`` at its offset) and decoded when its batch is fetched, in the DataLoader workers when there are some.

**Order, ranks and resume.** The shuffle is :meth:`ShardDataset.epoch_order`, a pure function of ``(seed, epoch)``
that keeps reads local: the shards are cut into blocks of at most :data:`BLOCK_ROWS` consecutive rows (never across
a Parquet row group or Arrow record batch), the blocks are shuffled, and cut in that order into windows, each
closed once it holds :data:`WINDOW_ROWS` rows or :data:`WINDOW_BYTES` of encoded images (from the index: the
tar members' sizes, the row groups' column sizes in the footer); the rows of each window are shuffled together. A
batch then reads a few row groups, not one per sample, and a reader's LRU (:data:`CACHE_BYTES`) holds the window
it is in and the next. The loader's ``EpochSampler`` takes this
order instead of ``torch.randperm`` and Accelerate splits each global batch over the ranks as for any map-style
data: no sample is on two ranks (each DataLoader worker fetches whole batches of its rank's share), 1 and N
processes see the same global batches, and a mid-epoch resume skips the batches already trained (the same samples
in the same order as without the stop), whatever the number of DataLoader workers.

Not used, and why: ``datasets``' ``IterableDataset`` (``state_dict()``) splits its shards over the ranks
(``split_dataset_by_node``: whole shards when their number divides the world size, else every N-th example) and
again over the DataLoader workers (and shifts each worker's shuffle by its id), and loses its shuffle buffer on a
resume; torchdata's ``StatefulDataLoader`` keeps each worker's state "but not across ranks". In both the order
depends on the number of ranks and workers, so neither gives the same global batches on 1 and N processes.
WebDataset's loader is an ``IterableDataset`` too, with no random access and no exact resume; its tar layout is read
here with the standard library's ``tarfile`` (no new dependency).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from accel_train.data import index_cache
from accel_train.data.augment import Augmented
from accel_train.data.base import DataConfig, DatasetInfo, DataSplits, stratified_split
from accel_train.data.folder import (
    TEST_DIR_NAMES,
    augment_for,
    choose_image_size,
    sample_indices,
    sample_stats,
    split_folder,
    valid_headers,
    valid_stats,
)
from accel_train.data.hf import TEST_SPLITS
from accel_train.data.identity import Identity, shards_part
from accel_train.data.images import DECODE_ERRORS, MAX_IMAGE_PIXELS, channels_for, mixed_modes_note
from accel_train.data.pixels import image_to_chw
from accel_train.data.shard_index import ShardIndex, arrow_table, index_shards, kind_of, shard_files
from accel_train.errors import UserError

BLOCK_ROWS = 1024  # consecutive rows of one row group (or tar) shuffled as a unit
WINDOW_ROWS = 4096  # a window of blocks whose rows are shuffled together closes at this many rows ...
WINDOW_BYTES = 64 * 1024**2  # ... or this many bytes of encoded images
CACHE_BYTES = 256 * 1024**2  # image bytes of row groups a process keeps (at least one group): windows and a margin
OPEN_FILES = 16  # tar files (or memory-mapped Arrow files) a process keeps open
HEADER_SAMPLE = 256  # images whose header is read for the channels and the size
BIG_GROUP = 65_536  # rows: a Parquet row group larger than this is worth a note (each is read whole)


def find_shards(root: Path) -> tuple[list[Path], list[Path] | None, str]:
    """(training shards, test shards or None, how the folder is split: "folders", "files" or "stratified")."""
    train_dir = split_folder(root, ("train",))
    if train_dir is not None:
        test_dir = split_folder(root, TEST_DIR_NAMES)
        train, test = _shards_in(train_dir), _shards_in(test_dir) if test_dir else None
        kind_of(train + (test or []), root)
        beside = shard_files(root)
        if beside:
            raise UserError(
                f"{root} holds shards beside its {train_dir.name}/ folder ({beside[0].name}, ...) that no split "
                f"reads; move them into {train_dir.name}/ or {test_dir.name if test_dir else 'test'}/"
            )
        return train, test, "folders"
    files = shard_files(root) or (shard_files(root / "data") if (root / "data").is_dir() else [])
    if not files:
        _shards_in(root)  # refuses, saying what to do
    kind_of(files, files[0].parent)
    by_split: dict[str, list[Path]] = {}
    for f in files:
        prefix = re.split(r"[-_.]", f.name, maxsplit=1)[0].lower()
        by_split.setdefault({"training": "train", "testing": "test"}.get(prefix, prefix), []).append(f)
    if "train" in by_split:
        return by_split["train"], next((by_split[n] for n in TEST_SPLITS if n in by_split), None), "files"
    named = [n for n in TEST_SPLITS if n in by_split]
    if named:  # a test split without a training split: never pooled into training silently
        raise UserError(
            f"{files[0].parent} holds {named[0]}-* shards but none named train-*: name the training shards "
            "train-00000-of-0000N.parquet (as on the Hub), or put the splits in train/ and test/ folders"
        )
    return files, None, "stratified"


def _shards_in(folder: Path) -> list[Path]:
    files = shard_files(folder)
    if not files:
        raise UserError(
            f"{folder} holds no shards: expected *.parquet files, *.arrow files (save_to_disk) or *.tar files in "
            "WebDataset layout (KEY.png + KEY.cls per sample), in it or in its train/ and test/ subfolders"
        )
    return files


# --------------------------------------------------------------------------- reading and decoding


class _Reader:
    """One process's access to the shards' bytes: an LRU of row groups' image columns (at most
    :data:`CACHE_BYTES`, at least one group) and of open files (at most :data:`OPEN_FILES`)."""

    def __init__(self, index: ShardIndex):
        self.index, self.pid = index, os.getpid()
        self.groups: OrderedDict[int, Any] = OrderedDict()
        self.held = 0
        self.files: OrderedDict[int, Any] = OrderedDict()  # shard -> tar file descriptor, or Arrow table

    def close(self) -> None:
        for handle in self.files.values():
            if isinstance(handle, int):
                os.close(handle)
        self.files.clear()
        self.groups.clear()

    def _file(self, shard: int):
        """The open tar (a file descriptor) or the memory-mapped Arrow table of ``shard``."""
        handle = self.files.pop(shard, None)
        if handle is None:
            path = self.index.files[shard]
            try:
                handle = os.open(path, os.O_RDONLY) if self.index.kind == "tar" else arrow_table(path)
            except (OSError, ValueError) as exc:  # (pyarrow's errors are OSErrors and ValueErrors)
                why = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200]
                raise UserError(f"cannot open shard {path}: {why}; replace it") from None
        self.files[shard] = handle
        while len(self.files) > OPEN_FILES:
            old = self.files.popitem(last=False)[1]
            if isinstance(old, int):
                os.close(old)
        return handle

    def read(self, row: int) -> bytes | None:
        """The encoded image of ``row`` (None when the row has none)."""
        if self.index.kind == "tar":
            return self._member(row)
        g = self.index.group_of(row)
        return self._group(g)[row - int(self.index.groups[g])].as_py()

    def _group(self, g: int):
        if g in self.groups:
            self.groups.move_to_end(g)
            return self.groups[g]
        column = self.groups[g] = self._read_group(g)
        self.held += column.nbytes
        while self.held > CACHE_BYTES and len(self.groups) > 1:
            self.held -= self.groups.popitem(last=False)[1].nbytes
        return column

    def _read_group(self, g: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        index, name = self.index, self.index.facts["image_column"]
        shard, at = int(index.group_shard[g]), int(index.group_index[g])
        if index.kind == "arrow":
            column = self._file(shard).column(name)
            column = pa.chunked_array([column.chunk(at)], column.type)  # record batch ``at``, still memory-mapped
        else:
            try:
                column = pq.ParquetFile(index.files[shard]).read_row_group(at, [name], use_threads=False).column(name)
            except (OSError, pa.ArrowException) as exc:
                why = " ".join(str(exc).split())[:200]
                raise UserError(f"cannot read shard {index.files[shard]}: {why}; replace the shard") from None
        if index.facts["image_kind"] == "struct":  # {bytes, path}: the bytes (flatten keeps a null row null)
            at = column.type.get_field_index("bytes")
            column = pa.chunked_array([chunk.flatten()[at] for chunk in column.chunks], column.type.field(at).type)
        return column

    def _member(self, row: int) -> bytes:
        index = self.index
        size = int(index.arrays["sizes"][row])
        data = os.pread(self._file(index.shard_of(row)), size, int(index.arrays["offsets"][row]))
        if len(data) != size:
            raise UserError(f"{index.where(row)} ends early: the shard was cut short after it was indexed; replace it")
        return data


def open_image_bytes(data: bytes | None, where: str):
    """``PIL.Image.open`` (header only) of encoded bytes within the pixel limit; one-line errors name ``where``."""
    from PIL import Image

    if not data:
        raise UserError(f"{where} holds no image bytes (an image stored by path only?); embed the image or remove it")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UserError(f"the image of {where} is too large (a decompression bomb?); resize it") from None
    except DECODE_ERRORS as exc:
        why = " ".join(str(exc).split())[:200]
        raise UserError(f"cannot decode the image of {where}: {why}; remove or replace it") from None
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise UserError(f"the image of {where} has {image.width}x{image.height} pixels, over the limit; resize it")
    return image


def decode_bytes(data: bytes | None, channels: int, size: int, where: str) -> torch.Tensor:
    """Encoded image bytes as uint8 [channels, size, size], oriented by their EXIF tag (as image files are)."""
    from PIL import ImageOps

    with open_image_bytes(data, where) as image:
        try:
            image.load()
            oriented = ImageOps.exif_transpose(image) if image.getexif().get(0x0112) is not None else image
            return image_to_chw(oriented, channels, size)
        except DECODE_ERRORS as exc:
            why = " ".join(str(exc).split())[:200]
            raise UserError(f"cannot decode the image of {where}: {why}; remove or replace it") from None


class ShardDataset(Augmented, Dataset):
    """Map-style view of some rows of a :class:`ShardIndex`, each image decoded when its batch is fetched.

    Samples are ``(uint8 [C, size, size], int label)``; ``__getitems__`` returns a whole batch augmented at once by
    ``transform`` (keyed on the sample's index). ``rows``: which rows of the index (default: all); ``class_of``: the
    index's label codes -> the model's classes. :meth:`epoch_order` is the loader's shuffle (module docstring).
    """

    def __init__(self, index: ShardIndex, channels: int, size: int, rows: np.ndarray | None = None,
                 class_of: np.ndarray | None = None, transform=None):  # fmt: skip
        self.index, self.channels, self.size = index, channels, size
        self.rows = np.arange(len(index), dtype=np.int64) if rows is None else np.sort(np.asarray(rows, np.int64))
        codes = index.labels[self.rows]
        labels = codes if class_of is None else np.asarray(class_of, dtype=np.int64)[codes]
        self._labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        rows, sizes = index.blocks(BLOCK_ROWS)
        bounds = np.searchsorted(self.rows, rows)  # each block's first and last position + 1
        kept = bounds[1:] > bounds[:-1]
        self.blocks = torch.from_numpy(np.stack([bounds[:-1][kept], bounds[1:][kept], sizes[kept]], 1).astype(np.int64))
        self._reader: _Reader | None = None
        self._init_augment(transform)

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reader": None}  # open files and cached groups stay in their process

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """A permutation of ``range(len(self))`` from ``(seed, epoch)`` alone: the blocks shuffled, cut into
        windows of :data:`WINDOW_ROWS` rows or :data:`WINDOW_BYTES` bytes, the rows of each window shuffled."""
        gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (1 << 63))
        parts, window, rows, held = [], [], 0, 0
        for start, end, size in self.blocks[torch.randperm(len(self.blocks), generator=gen)].tolist():
            window.append(torch.arange(start, end))
            rows, held = rows + end - start, held + size
            if rows >= WINDOW_ROWS or held >= WINDOW_BYTES:
                parts.append(_shuffled(window, gen))
                window, rows, held = [], 0, 0
        parts += [_shuffled(window, gen)] if window else []
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def _reading(self) -> _Reader:
        if self._reader is None or self._reader.pid != os.getpid():  # a DataLoader worker's first batch
            if self._reader is not None:
                self._reader.close()  # this process's copies of the parent's files
            self._reader = _Reader(self.index)
        return self._reader

    def __getitem__(self, index: int):
        images, labels = self.__getitems__([index + len(self) if index < 0 else index])
        return images[0], int(labels[0])

    def __getitems__(self, indices):
        reader = self._reading()
        rows = [int(self.rows[i]) for i in indices]
        decoded = [decode_bytes(reader.read(r), self.channels, self.size, self.index.where(r)) for r in rows]
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.augment(torch.stack(decoded), idx), self._labels.index_select(0, idx)

    def labels(self) -> torch.Tensor:
        return self._labels


def _shuffled(blocks: list[torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    rows = torch.cat(blocks)
    return rows[torch.randperm(len(rows), generator=gen)]


# --------------------------------------------------------------------------- the builder


def _classes(train: ShardIndex, test: ShardIndex | None, root: Path) -> tuple[list[str], list[np.ndarray]]:
    """The class names and, for each index, its label codes -> class (ClassLabel names, else the sorted values)."""
    both = [train] + ([test] if test is not None else [])
    names = train.class_label
    if names is not None:  # ClassLabel names: every shard's labels were read as names (shard_index), matched here
        lookup = {n: i for i, n in enumerate(names)}
        maps = [np.asarray([lookup[v] for v in train.values], dtype=np.int64)]
        if test is not None:
            maps.append(_test_by_name(test, names, lookup, root))
    else:
        kinds = {ix.facts["label_kind"] for ix in both}
        if len(kinds) > 1:
            raise UserError(f"{root}: train and test labels are of different kinds ({', '.join(sorted(kinds))})")
        union = sorted(set(train.values) | set(test.values if test is not None else []))
        names, lookup = [str(v) for v in union], {v: i for i, v in enumerate(union)}
        maps = [np.asarray([lookup[v] for v in ix.values], dtype=np.int64) for ix in both]
    if len(names) < 2:
        raise UserError(f"{root}: the shards hold {len(names)} class(es); need at least 2 classes")
    return names, maps


def _test_by_name(test: ShardIndex, names: list[str], lookup: dict[str, int], root: Path) -> np.ndarray:
    """The test shards' label codes -> train's ClassLabel classes: by name (ClassLabel or text labels), else, for
    plain integers, as indices into train's names."""
    if test.facts["label_kind"] == "int" and test.class_label is None:
        values = np.asarray(test.values, dtype=np.int64)
        if len(values) and (values.min() < 0 or values.max() >= len(names)):
            raise UserError(f"{root}: the test labels are not among the {len(names)} ClassLabel classes of train")
        return values
    unknown = [str(v) for v in test.values if str(v) not in lookup]
    if unknown:
        raise UserError(
            f"{root}: test label(s) {', '.join(map(repr, unknown[:5]))} are not among train's ClassLabel classes "
            f"({', '.join(names[:10])}); give the test shards the same class names"
        )
    return np.asarray([lookup[str(v)] for v in test.values], dtype=np.int64)


def _headers(index: ShardIndex) -> tuple[Counter, set[tuple[int, int]]]:
    """PIL modes and sizes of an evenly spaced sample of images (headers only), recorded with the index."""
    if not valid_headers(index.facts.get("headers")):
        reader, modes, sizes = _Reader(index), Counter(), set()
        try:
            for row in sample_indices(len(index), HEADER_SAMPLE):
                with open_image_bytes(reader.read(row), index.where(row)) as image:
                    modes[image.mode] += 1
                    sizes.add((image.height, image.width))
        finally:
            reader.close()
        index.cache.add_facts(headers={"modes": dict(modes), "sizes": sorted(sizes)})
    facts = index.facts["headers"]
    return Counter(facts["modes"]), {(int(h), int(w)) for h, w in facts["sizes"]}


def _stats(dataset: ShardDataset, what: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean/std of an evenly spaced sample (``sample_stats``), recorded with the index: a resume reads the same."""
    key = f"stats:{what}:{dataset.channels}:{dataset.size}"
    if not valid_stats(dataset.index.facts.get(key), dataset.channels):
        dataset.index.cache.add_facts(**{key: [list(v) for v in sample_stats(dataset)]})
    mean, std = dataset.index.facts[key]
    return tuple(mean), tuple(std)


def _notes(root: Path, index: ShardIndex, modes: Counter, channels: int) -> list[str]:
    notes = mixed_modes_note(root, modes, channels)
    skipped = Counter(index.facts.get("skipped_members") or {})
    if skipped:
        kinds = ", ".join(f"{n} {ext}" for ext, n in skipped.most_common(5))
        notes.append(
            f"{root}: {sum(skipped.values())} tar member(s) are neither an image nor a .cls and are not read "
            f"({kinds}); a sample is KEY.<image extension> + KEY.cls"
        )
    largest = int(np.diff(index.groups).max()) if len(index.groups) > 1 else 0
    if index.kind == "parquet" and largest > BIG_GROUP:
        notes.append(
            f"{root}: Parquet row groups of up to {largest} rows; each is read whole into memory by every "
            "DataLoader worker: write the shards with smaller row groups (pyarrow's row_group_size=1000)"
        )
    return notes


def _digest(*indexes: ShardIndex | None) -> str:
    """What every rank must agree on: the shards' names, sizes and rows, and the labels."""
    parts = [(f.name, f.stat().st_size, len(ix)) for ix in indexes if ix is not None for f in ix.files]
    labels = [(ix.values, ix.class_label, ix.labels.tobytes()) for ix in indexes if ix is not None]
    return hashlib.sha256(repr((parts, labels)).encode()).hexdigest()[:16]


def _identity(root: Path, train: ShardIndex, test: ShardIndex | None) -> Identity:
    parts = {"train": shards_part(train, root)}
    if test is not None:
        parts["test"] = shards_part(test, root)
    return Identity("shards", parts)


def _unread(train: ShardIndex, test: ShardIndex | None, how: str) -> list[str]:
    """One line naming the shards of other splits beside Hub-named ones (unlabeled-*, extra-*): not read."""
    if how != "files":
        return []
    used = set(train.files) | set(test.files if test is not None else [])
    unread = [f.name for f in shard_files(train.files[0].parent) if f not in used]
    if not unread:
        return []
    shown = ", ".join(repr(n) for n in unread[:3]) + (", ..." if len(unread) > 3 else "")
    return [f"{train.files[0].parent}: {len(unread)} shard(s) of other splits are not read ({shown})"]


def _indexed(cfg: DataConfig, path: str) -> tuple[Path, ShardIndex, ShardIndex | None, str]:
    """(the folder, its training shards' index, its test shards' index or None, how it is split)."""
    root = Path(path).expanduser().absolute()
    if not root.is_dir():
        raise UserError(f"shards folder {root} does not exist (or is not a folder); check --dataset shards:<path>")
    train_files, test_files, how = find_shards(root)
    train = index_shards(train_files, cfg.image_column, cfg.label_column)
    test = index_shards(test_files, cfg.image_column, cfg.label_column) if test_files else None
    return root, train, test, how


def build_shards(cfg: DataConfig, path: str) -> DataSplits:
    """Parquet, Arrow (save_to_disk) or WebDataset tar shards, read lazily (see the module docstring)."""
    root, train, test, how = _indexed(cfg, path)
    names, maps = _classes(train, test, root)
    train_rows = test_rows = None
    what = "all"
    if test is None:
        held = stratified_split(torch.from_numpy(maps[0][train.labels]), cfg.val_split, cfg.seed)
        if len(held[0]) == 0 or len(held[1]) == 0:
            raise UserError(
                f"{root}: val_split={cfg.val_split} leaves an empty train or test split of {len(train)} rows; use a "
                "val_split between 0 and 1, or give the shards train/ and test/ folders"
            )
        train_rows, test_rows, what = held[0].numpy(), held[1].numpy(), f"split:{cfg.val_split}:{cfg.seed}"
    modes, sizes = _headers(train)
    channels, size = channels_for(modes), choose_image_size(sizes, cfg.image_size)
    transform, augment = augment_for(cfg, size, channels)
    train_ds = ShardDataset(train, channels, size, train_rows, maps[0], transform=transform)
    test_ds = ShardDataset(test or train, channels, size, test_rows, maps[-1])
    mean, std = _stats(train_ds, what)
    info = DatasetInfo(f"shards:{path}", len(names), channels, size, names, mean, std)
    extra = {"source": str(root), "augment": augment, "split": how, "shards": train.kind}
    extra |= {"notes": index_cache.take_notes() + _notes(root, train, modes, channels) + _unread(train, test, how)}
    extra |= {"index_digest": _digest(train, test), "identity": _identity(root, train, test)}
    return DataSplits(train_ds, test_ds, info, in_memory=False, extra=extra)


def build_shards_eval(
    cfg: DataConfig, path: str, held_out: bool, channels: int, class_names: list[str] | None = None
) -> DataSplits:
    """The rows ``accel-evaluate`` scores in ``shards:path`` (``test``; ``train`` stays empty), as
    ``folder.build_imagefolder_eval`` does for folders: the test shards where the folder has a split of its own;
    else every row, or with ``held_out`` the rows ``train.py`` holds out with ``cfg.val_split`` and ``cfg.seed``
    (the same stratified choice, for the shards the model trained on). Rows are read as ``channels`` (the model's)
    and labelled by ``class_names`` (the model's, matched by name: the shards may hold a subset of the classes)."""
    root, train, test, how = _indexed(cfg, path)
    names, maps = _classes(train, test, root)
    scored, rows, what = test or train, None, "all"
    if test is not None:
        evaluated = f"every row of the test shards in {root} ({len(test)}, its test split)"
    elif held_out:
        rows = stratified_split(torch.from_numpy(maps[0][train.labels]), cfg.val_split, cfg.seed)[1].numpy()
        what = f"held-out:{cfg.val_split}:{cfg.seed}"  # not training's key: those stats are of the other rows
        how_held = f"--val-split {cfg.val_split} --seed {cfg.seed}"
        evaluated = f"the {len(rows)} of {len(train)} rows in {root} that {how_held} holds out"
    else:
        evaluated = f"every row in {root} ({len(train)}, no train/ and test/ split of its own)"
    class_of = maps[-1]
    if class_names is not None and names != class_names[: len(names)]:
        unknown = [n for n in names if n not in class_names]
        if unknown:
            raise UserError(
                f"{root} has class(es) {', '.join(map(repr, unknown[:5]))} that the model does not know (its "
                f"classes: {', '.join(class_names[:20])}); evaluate it on shards of the model's classes"
            )
        class_of = np.asarray([class_names.index(n) for n in names], dtype=np.int64)[class_of]
    modes, sizes = _headers(scored)
    size = choose_image_size(sizes, cfg.image_size)
    test_ds = ShardDataset(scored, channels, size, rows, class_of)
    mean, std = _stats(test_ds, what)
    names = class_names or names
    info = DatasetInfo(f"shards:{path}", len(names), channels, size, names, mean, std)
    extra = {"source": str(root), "split": how, "shards": scored.kind, "evaluated": evaluated}
    extra["identity"] = Identity("shards", {"test" if test is not None else "train": shards_part(scored, root)})
    extra["notes"] = index_cache.take_notes()
    empty = ShardDataset(scored, channels, size, np.zeros(0, dtype=np.int64), class_of)
    return DataSplits(empty, test_ds, info, in_memory=False, extra=extra)
