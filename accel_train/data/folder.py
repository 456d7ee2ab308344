"""``imagefolder:<path>``: a folder with one subfolder of images per class.

Layouts: ``<path>/<class>/<image>`` (training holds out ``cfg.val_split`` of it, chosen
deterministically by ``cfg.seed`` and stratified by class; ``accel-evaluate`` scores every
image, see :func:`build_imagefolder_eval`) or ``<path>/train/<class>/...`` plus
``<path>/test/<class>/...`` (``val``/``validation`` are accepted for ``test``; a test folder
alone can be evaluated, not trained on). The files are indexed with the ``datasets`` library's
``imagefolder`` builder (works offline) and decoded lazily, one image per ``__getitem__``.

Also home of the image helpers ``hf.py`` shares: :func:`infer_channels`,
:func:`image_to_chw`, :func:`images_to_nchw` and :class:`LazyImageDataset`.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from accel_train.data.augment import Augmented, CropFlip, KeyedAugment, crop_flip
from accel_train.data.base import DataConfig, DatasetInfo, DataSplits, stratified_split
from accel_train.data.images import DECODE_ERRORS, channels_for, check_image_files, mixed_modes_note
from accel_train.errors import UserError

DEFAULT_IMAGE_SIZE = 64  # used when the images differ in size and cfg.image_size is unset
SIZE_SAMPLE = 1000  # images whose header is read to decide whether all share one size
STATS_SAMPLE = 64  # images decoded to estimate mean/std
TEST_DIR_NAMES = ("test", "val", "validation")
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_FALLBACK_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})


# --------------------------------------------------------------------------- image conversion (shared with hf.py)


def image_extensions() -> frozenset[str]:
    """File extensions the ``imagefolder`` builder indexes (lower case, with the dot)."""
    try:
        from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

        return frozenset(e.lower() for e in ImageFolder.EXTENSIONS)
    except (ImportError, AttributeError):
        return _FALLBACK_EXTENSIONS


def _array_to_nchw(arr: np.ndarray, batched: bool) -> np.ndarray:
    """An image array ([H,W], [H,W,C] or [C,H,W]; with a leading N when ``batched``) as [N, C, H, W]."""
    if not batched:
        arr = arr[None]
    if arr.ndim == 3:
        return arr[:, None]
    if arr.ndim == 4:
        first, last = arr.shape[1], arr.shape[3]
        if last in (1, 2, 3, 4) and first not in (1, 2, 3, 4):
            return arr.transpose(0, 3, 1, 2)
        if first in (1, 2, 3, 4):
            return arr
        if last in (1, 2, 3, 4):
            return arr.transpose(0, 3, 1, 2)
    shape = tuple(arr.shape[1:])
    raise UserError(f"unsupported image array shape {shape}: expected [H, W], [H, W, C] or [C, H, W] with C in 1..4")


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating):
        if arr.size and float(np.nanmax(arr)) <= 1.0:  # [0, 1] floats
            arr = arr * 255.0
        return np.nan_to_num(arr).round().clip(0, 255).astype(np.uint8)
    return arr.clip(0, 255).astype(np.uint8)


def _match_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """[N, C, H, W] uint8 with C in 1..4 -> [N, channels, H, W] (drops alpha; ITU-R 601-2 luma for gray)."""
    c = x.shape[1]
    if c == 2:  # gray + alpha
        x, c = x[:, :1], 1
    elif c == 4:  # RGBA
        x, c = x[:, :3], 3
    if c == channels:
        return x
    if channels == 3:
        return x.expand(-1, 3, -1, -1)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    return (x.float() * weights).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)


def images_to_nchw(arr: Any, channels: int, size: int, batched: bool = True) -> torch.Tensor:
    """Image array(s) of any common layout/dtype -> uint8 [N, channels, size, size] (one batched resize)."""
    from accel_train.data.vision import resize_uint8

    x = torch.from_numpy(np.ascontiguousarray(_array_to_nchw(_to_uint8(np.asarray(arr)), batched)))
    return resize_uint8(_match_channels(x, channels), size).contiguous()


def image_to_chw(image: Any, channels: int, size: int) -> torch.Tensor:
    """One PIL image or array -> uint8 [channels, size, size]."""
    from PIL import Image

    if isinstance(image, Image.Image):
        mode = "L" if channels == 1 else "RGB"
        if image.mode != mode:
            image = image.convert(mode)
        if image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BILINEAR)  # PIL antialiases when shrinking
        arr = np.asarray(image)
        return torch.from_numpy(np.array(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1), order="C"))
    return images_to_nchw(image, channels, size, batched=False)[0]


def infer_channels(image: Any) -> int:
    """1 for grayscale images (PIL gray modes, 2-D or 1-/2-channel arrays), else 3."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return 1 if image.mode in GRAY_MODES else 3
    return 1 if _array_to_nchw(np.asarray(image), batched=False).shape[1] <= 2 else 3


def image_size_of(image: Any) -> tuple[int, int]:
    """(height, width) of a PIL image, an array, or an undecoded datasets image dict (header read only)."""
    from PIL import Image

    if isinstance(image, dict):  # datasets.Image(decode=False): {"bytes": ..., "path": ...}
        if image.get("bytes"):
            with Image.open(io.BytesIO(image["bytes"])) as im:
                return im.height, im.width
        with Image.open(image["path"]) as im:
            return im.height, im.width
    if isinstance(image, Image.Image):
        return image.height, image.width
    shape = _array_to_nchw(np.asarray(image), batched=False).shape
    return shape[2], shape[3]


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


def augment_for(cfg: DataConfig, size: int) -> tuple[CropFlip | None, str | None]:
    """Folder/hub datasets augment only on request (``cfg.augment is True``): random crop + flip."""
    if cfg.augment is not True:
        return None, None
    return crop_flip(cfg, size, max(1, size // 8), flip=True)


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


def _class_dirs(directory: Path, extensions: frozenset[str]) -> dict[str, int]:
    """Non-hidden subfolders of ``directory`` and how many images each holds (recursively)."""
    counts: dict[str, int] = {}
    for entry in sorted(directory.iterdir()):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        n = 0
        for _, dirnames, filenames in os.walk(entry):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            n += sum(1 for f in filenames if not f.startswith(".") and os.path.splitext(f)[1].lower() in extensions)
        counts[entry.name] = n
    return counts


def _check_classes(directory: Path, extensions: frozenset[str], least: int = 2) -> None:
    counts = _class_dirs(directory, extensions)
    with_images = [name for name, n in counts.items() if n > 0]
    layout = f"expected {directory}/<class name>/<image file>, one subfolder per class"
    if not with_images:
        what = "no class subfolders" if not counts else f"no image files in its subfolders ({', '.join(counts)})"
        raise UserError(f"empty folder: {directory} has {what}; {layout}")
    if len(with_images) < least:
        raise UserError(
            f"{directory} has images for only one class ({with_images[0]!r}); need at least 2 classes: {layout}"
        )


def imagefolder_layout(root: Path) -> tuple[str, Path]:
    """How ``root`` is laid out, and the folder holding its test images.

    ``("split", root/test)``: ``train/`` and ``test/`` (or ``val/``, ``validation/``); ``("test", root/test)``: a
    test folder is the only subfolder with images; ``("classes", root)``: class subfolders, no split of their own.
    """
    extensions = image_extensions()
    test_dir = next((root / n for n in TEST_DIR_NAMES if (root / n).is_dir()), None)
    if test_dir is None:
        return "classes", root
    if (root / "train").is_dir():
        return "split", test_dir
    with_images = [name for name, n in _class_dirs(root, extensions).items() if n > 0]
    return ("test", test_dir) if with_images == [test_dir.name] else ("classes", root)


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """No "Downloading data" / "Generating train split" bars nor info logs from ``datasets`` while it
    indexes local files (nothing is downloaded); its settings are restored after."""
    import datasets
    from datasets.utils import logging as ds_logging

    bars_were_off = datasets.are_progress_bars_disabled()
    verbosity = ds_logging.get_verbosity()
    with warnings.catch_warnings():  # HF_DATASETS_DISABLE_PROGRESS_BARS=0 keeps the bars, with a warning
        warnings.simplefilter("ignore")
        datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    try:
        yield
    finally:
        ds_logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _load_imagefolder(data_files: dict[str, str], where: Path):
    import datasets

    try:
        with quiet_datasets():
            dd = datasets.load_dataset("imagefolder", data_files=data_files)
    except Exception as exc:  # the builder's errors for unreadable layouts vary between versions
        raise UserError(f"cannot index the images in {where} with datasets' imagefolder: {exc}") from exc
    features = dd["train"].features
    if not isinstance(features.get("label"), datasets.ClassLabel):
        raise UserError(
            f"could not infer class labels for {where}: put every image exactly one level deep, in "
            "<class name>/ subfolders, and remove any metadata.csv/metadata.jsonl file"
        )
    return dd


def _root(path: str) -> Path:
    root = Path(path).expanduser().absolute()
    if not root.is_dir():
        raise UserError(f"image folder {root} does not exist (or is not a folder); check --dataset imagefolder:<path>")
    return root


def _held_out(full, cfg: DataConfig, root: Path) -> tuple[list[int], list[int]]:
    """(train, test) indices of a folder of classes: ``cfg.val_split`` held out per class, from ``cfg.seed``."""
    labels = torch.as_tensor(full.select_columns(["label"]).with_format("numpy")[:]["label"])
    train_idx, test_idx = stratified_split(labels, cfg.val_split, cfg.seed)
    if len(test_idx) == 0 or len(train_idx) == 0:
        raise UserError(
            f"{root}: val_split={cfg.val_split} leaves an empty train or test split for {len(labels)} images; "
            "use a val_split between 0 and 1 (or more images per class)"
        )
    return train_idx.tolist(), test_idx.tolist()


def _image_size(data, requested: int | None) -> int:
    """``requested``, else the one square size a sample of the image headers share (see choose_image_size)."""
    import datasets

    undecoded = data.cast_column("image", datasets.Image(decode=False))
    sizes = {image_size_of(undecoded[i]["image"]) for i in sample_indices(len(undecoded), SIZE_SAMPLE)}
    return choose_image_size(sizes, requested)


def build_imagefolder(cfg: DataConfig, path: str) -> DataSplits:
    """Classification data from a folder of class subfolders (see the module docstring)."""
    root = _root(path)
    extensions = image_extensions()
    layout, test_dir = imagefolder_layout(root)
    if layout == "test":
        raise UserError(
            f"{root} holds only {test_dir.name}/: nothing to train on; put the training images in "
            f"{root}/train/<class name>/ (eval.py evaluates {test_dir.name}/ as it is)"
        )
    split_layout = layout == "split"
    # every image opened once first: unreadable ones are named (with a count) before datasets indexes them
    modes = check_image_files([root / "train", test_dir] if split_layout else [root], extensions, root)
    if split_layout:
        _check_classes(root / "train", extensions)
        _check_classes(test_dir, extensions)
        dd = _load_imagefolder({"train": str(root / "train" / "**"), "test": str(test_dir / "**")}, root)
        train, test = dd["train"], dd["test"]
    else:
        _check_classes(root, extensions)
        full = _load_imagefolder({"train": str(root / "**")}, root)["train"]
        train_idx, test_idx = _held_out(full, cfg, root)
        train, test = full.select(train_idx), full.select(test_idx)
    class_names = list(train.features["label"].names)
    # colour if any image has colour; decode the first image only without modes (a bad one fails later, named)
    channels = channels_for(modes) if modes else infer_channels(train[0]["image"])
    size = _image_size(train, cfg.image_size)
    transform, augment = augment_for(cfg, size)
    train_ds = LazyImageDataset(train, "image", "label", channels, size, transform=transform)
    test_ds = LazyImageDataset(test, "image", "label", channels, size)
    mean, std = sample_stats(train_ds)
    info = DatasetInfo(f"imagefolder:{path}", len(class_names), channels, size, class_names, mean, std)
    extra = {"source": str(root), "augment": augment, "split": "folders" if split_layout else "stratified"}
    extra["notes"] = mixed_modes_note(root, modes, channels)  # printed once by the run (plan_warnings.warn_about_run)
    return DataSplits(train_ds, test_ds, info, in_memory=False, extra=extra)


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
    root = _root(path)
    extensions = image_extensions()
    layout, folder = imagefolder_layout(root)
    modes = check_image_files([folder], extensions, root)
    _check_classes(folder, extensions, least=1)
    data = _load_imagefolder({"train": str(folder / "**")}, root)["train"]
    total = len(data)
    if layout == "classes" and held_out:
        data = data.select(_held_out(data, cfg, root)[1])
        evaluated = (
            f"the {len(data)} of {total} images in {root} that --val-split {cfg.val_split} --seed {cfg.seed} holds out"
        )
    elif layout == "classes":
        evaluated = f"every image in {root} ({total}, no train/ or test/ subfolders)"
    else:
        evaluated = f"every image in {folder} ({total}, {'its test split' if layout == 'split' else 'the only split'})"
    found = list(data.features["label"].names)
    label_map = _label_map(found, class_names, folder)
    channels = channels or (channels_for(modes) if modes else infer_channels(data[0]["image"]))
    size = _image_size(data, cfg.image_size)
    test_ds = LazyImageDataset(data, "image", "label", channels, size, label_map=label_map)
    names = class_names or found
    mean, std = sample_stats(test_ds)
    info = DatasetInfo(f"imagefolder:{path}", len(names), channels, size, names, mean, std)
    extra = {"source": str(root), "split": layout, "evaluated": evaluated}
    empty = LazyImageDataset(data.select([]), "image", "label", channels, size)
    return DataSplits(empty, test_ds, info, in_memory=False, extra=extra)
