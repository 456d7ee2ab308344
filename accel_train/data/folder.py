"""``imagefolder:<path>``: a folder with one subfolder of images per class.

Layouts: ``<path>/<class>/<image>`` (training holds out ``cfg.val_split`` of it, chosen
deterministically by ``cfg.seed`` and stratified by class; ``accel-evaluate`` scores every
image, see :func:`build_imagefolder_eval`) or ``<path>/train/<class>/...`` plus
``<path>/test/<class>/...`` (``val``, ``valid`` and ``validation`` are accepted for ``test``; a test folder
alone can be evaluated, not trained on). Class folders beside such a split folder (``<path>/<class>/`` and
``<path>/test/<class>/``, no ``train/``) are the training split: a split folder's name is never a class. The files
are listed with ``os.scandir`` at every launch (``folder_index``; seconds for a million files) and what was read
from the images (sizes, modes, mean/std) is cached keyed by that list: a resume or another rank opens no image
again, and a changed file is never read as the old one. Files that are not images by their extension are counted
and named in one line, never dropped silently. Images are decoded lazily, a batch per ``__getitems__`` (in the
DataLoader workers when there are some). A folder of up to :data:`FULL_CHECK_MAX` images has every image opened
before training (the unreadable ones named with a count); a larger one reads a sample of headers, and a bad image
is named when it is first read.

Also home of what ``hf.py`` shares: :class:`LazyImageDataset` (a ``datasets.Dataset`` decoded lazily), the
size and statistics helpers; the pixel conversions live in ``pixels.py`` (re-exported here).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from accel_train.data import index_cache
from accel_train.data.augment import Augmented, CropFlip, KeyedAugment, crop_flip
from accel_train.data.base import DataConfig, DatasetInfo, DataSplits, stratified_split
from accel_train.data.folder_index import FileImageDataset, FolderIndex, index_folder, refuse_linked_twice, top_folders
from accel_train.data.identity import folder_identity
from accel_train.data.images import DECODE_ERRORS, channels_for, check_images, mixed_modes_note
from accel_train.data.pixels import (  # noqa: F401  (re-exported: hf.py, api.py, preprocess.py import them here)
    GRAY_MODES,
    image_size_of,
    image_to_chw,
    images_to_nchw,
    infer_channels,
)
from accel_train.data.settings import refuse_flags_that_do_not_apply
from accel_train.errors import UserError

DEFAULT_IMAGE_SIZE = 64  # used when the images differ in size and cfg.image_size is unset
SIZE_SAMPLE = 1000  # images whose header is read to decide whether all share one size
STATS_SAMPLE = 64  # images decoded to estimate mean/std
FULL_CHECK_MAX = 20_000  # up to this many images, each is opened and read whole before training (a few seconds)
TEST_DIR_NAMES = ("test", "val", "valid", "validation")  # the split folders recognised, in this order
#: What counts as an image file (lower case, with the dot): the extensions ``datasets``' ``imagefolder`` builder
#: indexed when it indexed our folders, so the same files are found as before.
IMAGE_EXTENSIONS = frozenset(
    ".apng .blp .bmp .bufr .bw .cur .dcx .dds .dib .emf .eps .fit .fits .flc .fli .ftc .ftu .gbr .gif .grib .icb "
    ".icns .ico .iim .im .j2c .j2k .jfif .jp2 .jpc .jpe .jpeg .jpf .jpg .jpx .mpeg .mpg .msp .pbm .pcd .pcx .pgm "
    ".png .pnm .ppm .ps .psd .pxr .ras .rgb .rgba .sgi .tga .tif .tiff .vda .vst .webp .wmf .xbm .xpm".split()
)


def image_extensions() -> frozenset[str]:
    """File extensions an image folder's index holds (lower case, with the dot)."""
    return IMAGE_EXTENSIONS


def choose_image_size(sizes: set[tuple[int, int]], requested: int | None) -> int:
    """``requested``, else the one shared square size, else :data:`DEFAULT_IMAGE_SIZE`."""
    if requested:
        return requested
    if len(sizes) == 1:
        ((h, w),) = sizes
        if h == w:
            return h
    return DEFAULT_IMAGE_SIZE


def sample_indices(n: int, k: int) -> list[int]:
    """Up to ``k`` evenly spaced indices in ``range(n)``, always including 0."""
    if n <= k:
        return list(range(n))
    return sorted({int(i) for i in np.linspace(0, n - 1, k)})


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std in [0, 1] of a uint8 [N, C, H, W] sample (std floored to avoid blow-ups)."""
    x = images.float().div_(255.0).transpose(0, 1).reshape(images.shape[1], -1)
    mean = tuple(round(v, 4) for v in x.mean(1).tolist())
    std = tuple(round(max(v, 0.01), 4) for v in x.std(1).tolist())
    return mean, std


class LazyImageDataset(Augmented, Dataset):
    """Map-style view of a ``datasets.Dataset``: decodes each image when it is fetched.

    Samples are ``(uint8 [C, size, size], int label)``; ``__getitems__`` returns a whole batch
    ``(uint8 [B, C, size, size], int64 [B])``, augmented at once by ``transform`` (a keyed batched
    augmentation, as for in-memory data; it runs in the DataLoader workers when there are some).
    ``label_map`` translates raw labels (e.g. strings) to class indices.
    """

    def __init__(
        self,
        data,
        image_column: str,
        label_column: str,
        channels: int,
        size: int,
        label_map: dict | None = None,
        transform: KeyedAugment | Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.data = data
        self.image_column = image_column
        self.label_column = label_column
        self.channels = channels
        self.size = size
        self.label_map = label_map
        self._init_augment(transform)

    def __len__(self) -> int:
        return len(self.data)

    def _decode(self, index: int) -> tuple[torch.Tensor, int]:
        try:
            row = self.data[int(index)]  # datasets decodes the image here
            image = image_to_chw(row[self.image_column], self.channels, self.size)
        except DECODE_ERRORS as exc:  # it passed the up-front check (header, checksums) but its pixels do not decode
            raise UserError(f"cannot decode image {self._name(index)}: {exc}; remove or replace it") from None
        label = row[self.label_column]
        return image, int(self.label_map[label] if self.label_map is not None else label)

    def __getitem__(self, index: int):
        images, labels = self.__getitems__([index + len(self) if index < 0 else index])
        return images[0], int(labels[0])

    def __getitems__(self, indices: list[int]):
        samples = [self._decode(i) for i in indices]
        images = torch.stack([image for image, _ in samples])
        labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
        return self.augment(images, torch.as_tensor(indices, dtype=torch.int64)), labels

    def _name(self, index: int) -> str:
        """The file behind sample ``index``, for an error message (else the sample's index)."""
        import datasets

        try:
            raw = self.data.cast_column(self.image_column, datasets.Image(decode=False))[int(index)]
            return str(raw[self.image_column]["path"])
        except Exception:  # noqa: BLE001 - only for the message: bytes without a path, another column type
            return f"sample {index} of column {self.image_column!r}"

    def labels(self) -> torch.Tensor:
        """All labels as class indices (one columnar read, no image decoding)."""
        raw = self.data.select_columns([self.label_column]).with_format("numpy")[:][self.label_column]
        if self.label_map is not None:
            raw = [self.label_map[v.item() if hasattr(v, "item") else v] for v in raw]
        return torch.as_tensor(np.asarray(raw, dtype=np.int64))


def augment_for(cfg: DataConfig, size: int, channels: int) -> tuple[CropFlip | None, str | None]:
    """Folder/hub datasets augment only on request (``cfg.augment is True``): random crop, and a horizontal flip
    for colour images (grey ones are digits, letters and drawings more often than not: mirrored, another symbol;
    on an MNIST folder the flip cost 0.65 points, 98.00% against 98.65%)."""
    if cfg.augment is not True:
        return None, None
    return crop_flip(cfg, size, max(1, size // 8), flip=channels != 1)


def unaugmented_sample(dataset: Dataset, k: int) -> torch.Tensor:
    """Up to ``k`` evenly spaced samples of ``dataset``, decoded without its augmentation, as uint8 [N, C, H, W]."""
    transform = getattr(dataset, "transform", None)
    if transform is not None:
        dataset.transform = None  # type: ignore[attr-defined]  # the data's statistics, not its augmentation's
    try:
        return torch.stack([torch.as_tensor(dataset[i][0]) for i in sample_indices(len(dataset), k)])
    finally:
        if transform is not None:
            dataset.transform = transform  # type: ignore[attr-defined]


def sample_stats(dataset: Dataset, k: int = STATS_SAMPLE) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean/std estimated from up to ``k`` evenly spaced decoded samples (no augmentation)."""
    return channel_stats(unaugmented_sample(dataset, k))


# --------------------------------------------------------------------------- imagefolder


def _index(folder: Path, exclude: frozenset[str] = frozenset()) -> FolderIndex:
    """The folder's index (see folder_index), with the classes that hold no image left out."""
    index = index_folder(folder, image_extensions(), exclude)
    counts = index.counts()
    if all(counts.values()):
        return index
    kept = [i for i, name in enumerate(index.classes) if counts[name]]
    relabel = np.full(len(index.classes), -1, dtype=np.int64)
    relabel[kept] = np.arange(len(kept))
    return replace(index, classes=[index.classes[i] for i in kept], labels=relabel[index.labels])


def _check_classes(directory: Path, least: int = 2, exclude: frozenset[str] = frozenset()) -> FolderIndex:
    index = _index(directory, exclude)
    layout = f"expected {directory}/<class name>/<image file>, one subfolder per class"
    if not index.classes:
        subfolders = top_folders(directory, exclude)
        what = f"no image files in its subfolders ({', '.join(subfolders)})" if subfolders else "no class subfolders"
        raise UserError(f"empty folder: {directory} has {what}{_skipped_words(index)}; {layout}")
    if len(index.classes) < least:
        raise UserError(
            f"{directory} has images for only one class ({index.classes[0]!r}); need at least 2 classes: {layout}"
        )
    return index


def _skipped_words(index: FolderIndex) -> str:
    """`` (and N files that are not images: ...)`` for an error that says a folder holds no images."""
    if not index.skipped:
        return ""
    total = sum(index.skipped.values())
    kinds = ", ".join(f"{n} {ext}" for ext, n in index.skipped.most_common(4))
    return f" (only {total} file(s) that are not images by their extension: {kinds}; e.g. {index.skipped_examples[0]})"


def _skipped_note(root: Path, *indexes: FolderIndex) -> list[str]:
    """One line for the files in class folders that are not images by their extension (left out of training),
    naming the classes that hold nothing else (left out too)."""
    skipped = sum((ix.skipped for ix in indexes), Counter())
    if not skipped:
        return []
    total = sum(skipped.values())
    kinds = ", ".join(f"{n} {ext}" for ext, n in skipped.most_common(5))
    examples = [e for ix in indexes for e in ix.skipped_examples][:3]
    known = {c for ix in indexes for c in ix.classes}
    gone = sorted({e.split("/")[0] for ix in indexes for e in ix.skipped_examples} - known)
    without = f"; class folder(s) with nothing else, left out: {', '.join(gone)}" if gone else ""
    line = (
        f"{root}: {total} file(s) in the class folders are not images by their extension and are left out ({kinds}; "
        f"e.g. {', '.join(map(repr, examples))}){without}; convert them to PNG/JPEG to train on them, or move them out"
    )
    return [" ".join(line.split())]  # one line, whatever the names hold


def imagefolder_layout(root: Path) -> tuple[str, Path]:
    """How ``root`` is laid out, and the folder holding its test images.

    ``("split", root/test)``: ``train/`` and ``test/`` (or ``val/``, ``valid/``, ``validation/``); ``("beside",
    root/test)``: class folders beside a test folder (they are the training split); ``("test", root/test)``: a
    test folder is the only subfolder; ``("classes", root)``: class subfolders, no split of their own.
    """
    test_dir = split_folder(root, TEST_DIR_NAMES)
    if test_dir is None:
        return "classes", root
    if split_folder(root, ("train",)) is not None:
        return "split", test_dir
    others = [name for name in top_folders(root) if name.lower() not in TEST_DIR_NAMES]
    return ("beside", test_dir) if others else ("test", test_dir)


def split_folder(root: Path, names: tuple[str, ...]) -> Path | None:
    """The subfolder of ``root`` named as the first of ``names`` that is there, in any case (``TEST/``, ``Train/``)."""
    try:
        found = {e.name.lower(): e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")}
    except OSError:
        return None
    return next((root / found[n] for n in names if n in found), None)


def _root(path: str) -> Path:
    root = Path(path).expanduser().absolute()
    if not root.is_dir():
        raise UserError(f"image folder {root} does not exist (or is not a folder); check --dataset imagefolder:<path>")
    return root


def _held_out(index: FolderIndex, cfg: DataConfig, root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) rows of a folder of classes: ``cfg.val_split`` held out per class, from ``cfg.seed``."""
    train_idx, test_idx = stratified_split(torch.from_numpy(index.labels), cfg.val_split, cfg.seed)
    if len(test_idx) == 0 or len(train_idx) == 0:
        raise UserError(
            f"{root}: val_split={cfg.val_split} leaves an empty train or test split for {len(index)} images; "
            "use a val_split between 0 and 1 (or more images per class)"
        )
    return train_idx.numpy(), test_idx.numpy()


def valid_headers(facts) -> bool:
    try:
        return all(isinstance(n, int) for n in facts["modes"].values()) and all(len(s) == 2 for s in facts["sizes"])
    except (KeyError, TypeError, AttributeError):
        return False


def _headers(index: FolderIndex, where: Path) -> tuple[Counter, Counter]:
    """The PIL modes and sizes of the folder's images, with how many images have each: of every image (each read
    whole, the unreadable ones named with a count) up to :data:`FULL_CHECK_MAX` images, of an evenly spaced sample
    of headers above. Recorded with the index's file list, so a resume or another rank reads no image for them."""
    facts = index.cache.facts.get("headers") if index.cache else None
    if not valid_headers(facts) or not _valid_counts(facts.get("size_counts")):
        everything = len(index) <= FULL_CHECK_MAX
        rows = range(len(index)) if everything else sample_indices(len(index), SIZE_SAMPLE)
        modes, sizes = check_images((index.path(i) for i in rows), where, verify=everything)
        counts = [[h, w, n] for (h, w), n in sorted(sizes.items())]
        facts = {"modes": dict(modes), "sizes": sorted(sizes), "size_counts": counts, "read": len(rows)}
        if index.cache:
            index.cache.add_facts(headers=facts)
    return Counter(facts["modes"]), Counter({(int(h), int(w)): int(n) for h, w, n in facts["size_counts"]})


def _valid_counts(counts) -> bool:
    return isinstance(counts, list) and all(isinstance(c, list) and len(c) == 3 for c in counts)


def short_sides(sizes: Counter) -> dict[int, int]:
    """How many images have each shorter side (``defaults.looks_like_photos`` takes the median image's)."""
    sides: Counter = Counter()
    for (h, w), n in sizes.items():
        sides[min(h, w)] += n
    return dict(sides)


def _stats(dataset: FileImageDataset, what: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean/std of an evenly spaced sample of ``dataset`` (see sample_stats), recorded with its index."""
    cache = dataset.index.cache
    key = f"stats:{what}:{dataset.channels}:{dataset.size}"
    saved = cache.facts.get(key) if cache is not None else None
    if valid_stats(saved, dataset.channels):
        mean, std = saved
        return tuple(float(v) for v in mean), tuple(float(v) for v in std)
    mean, std = sample_stats(dataset)
    if cache is not None:
        cache.add_facts(**{key: [list(mean), list(std)]})
    return mean, std


def valid_stats(saved, channels: int) -> bool:
    try:
        mean, std = saved
        return len(mean) == len(std) == channels and all(isinstance(v, (int, float)) for v in (*mean, *std))
    except (TypeError, ValueError):
        return False


def build_imagefolder(cfg: DataConfig, path: str) -> DataSplits:
    """Classification data from a folder of class subfolders (see the module docstring)."""
    refuse_flags_that_do_not_apply(cfg.dataset, {"image_column": cfg.image_column, "label_column": cfg.label_column})
    root = _root(path)
    layout, test_dir = imagefolder_layout(root)
    if layout == "test":
        raise UserError(
            f"{root} holds only {test_dir.name}/: nothing to train on; put the training images in "
            f"{root}/train/<class name>/ (eval.py evaluates {test_dir.name}/ as it is)"
        )
    split_layout = layout in ("split", "beside")
    if split_layout:
        train_index = _train_index(root, layout)
        test_index = _check_classes(test_dir)
        refuse_linked_twice(train_index, test_index)  # a test/ that links to train/, or test images linked in
        train_rows, test_rows, what = None, None, "all"
        modes, sizes = _headers(train_index, root)
        modes += _headers(test_index, root)[0]
        test_map = _label_map(test_index.classes, train_index.classes, test_dir)
    else:
        train_index = test_index = _check_classes(root)
        refuse_linked_twice(train_index, same_class=True)  # one file twice could be held out and trained on
        train_rows, test_rows = _held_out(train_index, cfg, root)
        what, test_map = f"split:{cfg.val_split}:{cfg.seed}", None
        modes, sizes = _headers(train_index, root)
    class_names = list(train_index.classes)
    channels = channels_for(modes)  # colour if any image read has colour
    size = choose_image_size(sizes, cfg.image_size)
    transform, augment = augment_for(cfg, size, channels)
    train_ds = FileImageDataset(train_index, channels, size, train_rows, transform=transform)
    test_ds = FileImageDataset(test_index, channels, size, test_rows, label_map=test_map)
    mean, std = _stats(train_ds, what)
    info = DatasetInfo(f"imagefolder:{path}", len(class_names), channels, size, class_names, mean, std)
    extra = {"source": str(root), "augment": augment, "split": "folders" if split_layout else "stratified"}
    extra["short_sides"] = short_sides(sizes)  # photos? (defaults.looks_like_photos)
    extra["index_digest"] = f"{train_index.digest()}-{test_index.digest()}"  # build.py: the same on every rank
    extra["identity"] = folder_identity(root, train_index, test_index if split_layout else None)
    extra["notes"] = (  # printed once by the run (plan_warnings.warn_about_run)
        index_cache.take_notes()
        + _skipped_note(root, *([train_index, test_index] if split_layout else [train_index]))
        + mixed_modes_note(root, modes, channels)
    )
    if layout == "beside":
        extra["notes"].append(f"{root}: the class folders beside {test_dir.name}/ are the training split, "
                              f"{test_dir.name}/ the test split")  # fmt: skip
    extra["notes"] += _left_out(root, layout, test_dir)
    return DataSplits(train_ds, test_ds, info, in_memory=False, extra=extra)


def _left_out(root: Path, layout: str, test_dir: Path | None) -> list[str]:
    """One line naming what the layout does not read: folders beside ``train/`` and the test folder (another
    split folder among them), and images lying loose in the folder or in a split folder (not in a class)."""
    train = split_folder(root, ("train",)) if layout == "split" else None
    folders = [n for n in top_folders(root) if n not in (test_dir.name, train.name)] if train and test_dir else []
    if layout == "beside" and test_dir is not None:
        folders = [n for n in top_folders(root) if n.lower() in TEST_DIR_NAMES and n != test_dir.name]
    loose = []
    for where in {root, *(d for d in (test_dir, train) if d is not None)}:
        try:
            loose += [f"{where.name}/{e.name}" for e in os.scandir(where) if not e.name.startswith(".") and
                      os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS and e.is_file()]  # fmt: skip
        except OSError:
            continue
    said = [f"folder(s) {', '.join(repr(f + '/') for f in sorted(folders)[:5])} beside the splits"] if folders else []
    said += [f"{len(loose)} image(s) outside any class folder (e.g. {sorted(loose)[0]!r})"] if loose else []
    if not said:
        return []
    line = f"{root}: not read: {'; '.join(said)}; move what you mean to train into a class folder"
    return [" ".join(line.split())]  # one line, whatever the names hold


def _train_index(root: Path, layout: str) -> FolderIndex:
    """The training split's index: ``train/``, or the class folders beside the split folder (its name left out)."""
    if layout == "beside":
        return _check_classes(root, exclude=frozenset(n for n in top_folders(root) if n.lower() in TEST_DIR_NAMES))
    train = split_folder(root, ("train",))
    nested = [n for n in top_folders(train) if n.lower() in (*TEST_DIR_NAMES, "train")]
    if nested:
        raise UserError(
            f"{train} holds a folder named {nested[0]!r}, a split folder's name, as a class: move it to "
            f"{root}/{nested[0]}/ if it is a split, or rename the class"
        )
    return _check_classes(train)


def _label_map(found: list[str], class_names: list[str] | None, folder: Path) -> dict[int, int] | None:
    """The folder's class indices -> the model's, by name (None: the same order, or no names to go by)."""
    if class_names is None or found == class_names[: len(found)]:
        return None
    unknown = [name for name in found if name not in class_names]
    if unknown:
        raise UserError(
            f"{folder} has class folder(s) {', '.join(map(repr, unknown[:5]))} that the model does not know "
            f"(its classes: {', '.join(class_names[:20])}); rename or remove them"
        )
    return {i: class_names.index(name) for i, name in enumerate(found)}


def build_imagefolder_eval(
    cfg: DataConfig, path: str, held_out: bool, channels: int | None = None, class_names: list[str] | None = None
) -> DataSplits:
    """The images ``accel-evaluate`` scores in ``imagefolder:path`` (``test``; ``train`` stays empty).

    ``train/`` + ``test/`` (or ``val/``): the test folder; a test folder alone: all of it; class subfolders: every
    image, or with ``held_out`` the part ``train.py`` holds out with ``cfg.val_split`` and ``cfg.seed`` (for the
    folder the model was trained on). Images are read as ``channels`` (the model's) at ``cfg.image_size``, and
    labelled by ``class_names`` (the model's, matched by folder name: a folder may hold a subset of the classes).
    ``extra["evaluated"]`` says in words which images were scored.
    """
    refuse_flags_that_do_not_apply(cfg.dataset, {"image_column": cfg.image_column, "label_column": cfg.label_column})
    root = _root(path)
    layout, folder = imagefolder_layout(root)
    index = _check_classes(folder, least=1)
    modes, sizes = _headers(index, root)
    total = len(index)
    rows, what = None, "all"
    if layout == "classes" and held_out:
        rows, what = _held_out(index, cfg, root)[1], f"held-out:{cfg.val_split}:{cfg.seed}"
        evaluated = (
            f"the {len(rows)} of {total} images in {root} that --val-split {cfg.val_split} --seed {cfg.seed} holds out"
        )
    elif layout == "classes":
        evaluated = f"every image in {root} ({total}, no train/ or test/ subfolders)"
    else:
        evaluated = f"every image in {folder} ({total}, {'the only split' if layout == 'test' else 'its test split'})"
    label_map = _label_map(index.classes, class_names, folder)
    channels = channels or channels_for(modes)
    size = choose_image_size(sizes, cfg.image_size)
    test_ds = FileImageDataset(index, channels, size, rows, label_map=label_map)
    names = class_names or list(index.classes)
    mean, std = _stats(test_ds, what)
    info = DatasetInfo(f"imagefolder:{path}", len(names), channels, size, names, mean, std)
    extra = {"source": str(root), "split": layout, "evaluated": evaluated}
    extra["identity"] = folder_identity(root, index) if layout == "classes" else folder_identity(root, None, index)
    extra["notes"] = index_cache.take_notes() + _skipped_note(root, index)
    empty = FileImageDataset(index, channels, size, np.zeros(0, dtype=np.int64))
    return DataSplits(empty, test_ds, info, in_memory=False, extra=extra)
