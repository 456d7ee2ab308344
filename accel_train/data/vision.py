"""``mnist``, ``fashion_mnist``, ``cifar10``: the classic datasets from their on-disk files.

Files are read from ``cfg.data_dir`` in torchvision's layouts::

    <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    <root>/FashionMNIST/raw/... (same names)
    <root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}

and parsed by this module (a validating IDX reader; a restricted unpickler for
the CIFAR batches, which never runs arbitrary pickled code). torchvision is
used only to download (``cfg.download``): its ``MNIST``/``CIFAR10`` classes need
every file of both splits (CIFAR10: with the official md5s) even to read the test
split alone, as an evaluation does; read only uncompressed IDX files; answer a
damaged file with a bare ``AssertionError``; unpickle CIFAR batches with plain
``pickle.load``; and importing torchvision costs a run about a second. Whole
splits are held as uint8 tensors (:class:`TensorImageDataset`).
"""

from __future__ import annotations

import codecs
import gzip
import io
import math
import os
import pickle
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from accel_train.data import DOWNLOAD_HINT
from accel_train.data.augment import crop_flip, opt_in_crop, scaled_padding
from accel_train.data.base import (
    DataConfig,
    DatasetInfo,
    DataSplits,
)
from accel_train.errors import UserError

IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dims
IDX_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dim
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_CLASSES = [str(i) for i in range(10)]
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
RESIZE_CHUNK = 4096  # images resized per interpolate call (bounds the float copy)


# --------------------------------------------------------------------------- shared helpers


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a uint8 [N, C, H, W] tensor to ``size`` x ``size`` (bilinear, antialiased), in chunks."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, images.shape[0], RESIZE_CHUNK):
        chunk = images[start : start + RESIZE_CHUNK].float()
        chunk = F.interpolate(chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[start : start + RESIZE_CHUNK] = chunk.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _refetch(what: str = "it") -> str:
    """What to do about a damaged file, in the words of the program running (see ``build_dataset``)."""
    return f"delete {what} and re-download with {DOWNLOAD_HINT.get()}"


def _fetch_or_place() -> str:
    return f"Fetch them with {DOWNLOAD_HINT.get()} (needs network) or place the files there"


def _find(directory: Path, name: str) -> Path | None:
    """``directory/name`` or ``directory/name.gz``, whichever exists (plain first)."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


# --------------------------------------------------------------------------- download


def _download(name: str, root: Path, subdir: str, fetch: Callable[[str], object], where: str) -> None:
    """``fetch(staging)`` (a torchvision download) into a new folder, then move ``staging/subdir``'s files to
    ``root/subdir``. A failure (network, checksum, extraction, full disk) leaves nothing behind: the staging
    folder goes with it, and ``root`` is not even created. torchvision's own download, on failure, leaves
    partial files and folders, and on success keeps the archives (CIFAR-10's 170 MB .tar.gz)."""
    anchor = next(p for p in (root, *root.parents) if p.is_dir())  # the same file system: the moves are renames
    try:
        with tempfile.TemporaryDirectory(prefix=".download-", dir=anchor) as staging:
            fetch(staging)
            fetched = Path(staging, subdir)
            for path in sorted(p for p in fetched.rglob("*") if p.is_file()):
                dest = root / subdir / path.relative_to(fetched)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
    except Exception as exc:  # any failure of the network/extract step becomes one clear message
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
        reason = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        raise UserError(
            f"downloading {name} into {root} failed ({type(exc).__name__}: {reason}); "
            f"is there network access? Without network, download the files elsewhere and place {where}; "
            "anything this attempt created was removed"
        ) from exc


# --------------------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)


def _read_bytes(path: Path) -> bytearray:
    """File contents, gunzipped when the name ends in ``.gz``; returned writable (no torch warnings)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return bytearray(f.read())
        return bytearray(path.read_bytes())
    except (OSError, EOFError) as exc:
        raise UserError(f"cannot read {path}: {exc}; the file is corrupt or truncated, {_refetch()}") from exc


def read_idx(path: str | os.PathLike, expected_magic: int) -> np.ndarray:
    """Parse an unsigned-byte IDX file (plain or ``.gz``), validating magic, dims and length."""
    path = Path(path)
    data = _read_bytes(path)
    fix = _refetch()
    if len(data) < 4:
        raise UserError(f"corrupt IDX header in {path}: only {len(data)} bytes; {fix}")
    (magic,) = struct.unpack(">I", data[:4])
    if magic != expected_magic:
        raise UserError(f"corrupt IDX header in {path}: magic 0x{magic:08x} (expected 0x{expected_magic:08x}); {fix}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"corrupt IDX header in {path}: truncated inside the {ndim} dimension sizes; {fix}")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    if any(d == 0 for d in dims):
        raise UserError(f"corrupt IDX header in {path}: dimensions {dims} contain a zero; {fix}")
    expected_len = header + math.prod(dims)
    if len(data) != expected_len:
        raise UserError(
            f"corrupt IDX file {path}: header says shape {dims} ({expected_len} bytes) "
            f"but the file has {len(data)} bytes; {fix}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _load_idx_split(raw: Path, images_name: str, labels_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    images_path, labels_path = _find(raw, images_name), _find(raw, labels_name)
    assert images_path is not None and labels_path is not None  # checked by the caller
    images = read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)
    if len(images) != len(labels):
        raise UserError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels; "
            f"the files do not belong together, {_refetch('them')}"
        )
    if labels.size and int(labels.max()) > 9:
        raise UserError(f"{labels_path} contains label {int(labels.max())} (expected 0..9); delete it and re-download")
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels).long()


def _idx_names(test_only: bool) -> list[str]:
    return [n for split in (("test",) if test_only else ("train", "test")) for n in MNIST_FILES[split]]


def _missing_idx(raw: Path, names: list[str] | None = None) -> list[str]:
    return [n for n in names or _idx_names(False) if _find(raw, n) is None]


def _build_idx(
    cfg: DataConfig,
    name: str,
    subdir: str,
    classes: list[str],
    mean: float,
    std: float,
    fetch_cls: str,
    test_only: bool = False,
) -> DataSplits:
    root = Path(cfg.data_dir).expanduser().absolute()
    raw = root / subdir / "raw"
    names = _idx_names(test_only)
    missing = _missing_idx(raw, names)
    if missing and cfg.download:
        import torchvision.datasets as tvd

        _download(
            name,
            root,
            subdir,
            lambda staging: getattr(tvd, fetch_cls)(staging, train=True, download=True),
            f"{', '.join(names)} (optionally .gz) in {raw}",
        )
        missing = _missing_idx(raw, names)
    if missing:
        raise UserError(
            f"{name} not found: expected {', '.join(names)} (optionally .gz) in {raw}; "
            f"missing: {', '.join(missing)}. {_fetch_or_place()}"
        )
    if test_only:  # an empty train split of the test split's shape
        x_test, y_test = _load_idx_split(raw, *MNIST_FILES["test"])
        x_train, y_train = x_test[:0], y_test[:0]
    else:
        x_train, y_train = _load_idx_split(raw, *MNIST_FILES["train"])
        x_test, y_test = _load_idx_split(raw, *MNIST_FILES["test"])
    native = x_train.shape[-1]
    size = cfg.image_size or native
    x_train, x_test = resize_uint8(x_train, size), resize_uint8(x_test, size)
    transform, augment = opt_in_crop(cfg, size, native)
    info = DatasetInfo(
        name=name,
        num_classes=len(classes),
        in_channels=1,
        image_size=size,
        class_names=list(classes),
        mean=(mean,),
        std=(std,),
    )
    splits = (x_train, y_train), (x_test, y_test)
    return DataSplits.of_tensors(*splits, info, transform, augment=augment, source=str(raw))


def build_mnist(cfg: DataConfig, test_only: bool = False) -> DataSplits:
    """MNIST from ``<data_dir>/MNIST/raw`` (IDX files, plain or gzipped); ``test_only``: the t10k files alone."""
    return _build_idx(cfg, "mnist", "MNIST", MNIST_CLASSES, 0.1307, 0.3081, "MNIST", test_only)


def build_fashion_mnist(cfg: DataConfig, test_only: bool = False) -> DataSplits:
    """Fashion-MNIST from ``<data_dir>/FashionMNIST/raw`` (IDX files, plain or gzipped); ``test_only``: t10k only."""
    classes = FASHION_MNIST_CLASSES
    return _build_idx(cfg, "fashion_mnist", "FashionMNIST", classes, 0.2860, 0.3530, "FashionMNIST", test_only)


# --------------------------------------------------------------------------- CIFAR-10


def _numpy_reconstructors() -> dict[tuple[str, str], object]:
    """The only globals a pickled CIFAR batch (any protocol, numpy 1.x or 2.x) may reference."""
    core = getattr(np, "_core", None) or np.core
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # protocol-2 pickles of bytes written by Python 3
    }
    for pkg in ("numpy.core", "numpy._core"):
        allowed[(f"{pkg}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        frombuffer = getattr(core.numeric, "_frombuffer", None)  # protocol 5
        if frombuffer is not None:
            allowed[(f"{pkg}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays and plain containers; refuses every other global."""

    def __init__(self, file: io.BufferedIOBase, path: Path):
        super().__init__(file, encoding="bytes")
        self._path = path
        self._allowed = _numpy_reconstructors()

    def find_class(self, module: str, name: str):
        obj = self._allowed.get((module, name))
        if obj is None:
            raise UserError(
                f"{self._path} is not a CIFAR-10 batch file: it references {module}.{name}, which a CIFAR batch never "
                f"needs, and may be malicious; it was NOT loaded: {_refetch()}"
            )
        return obj

    def persistent_load(self, pid):
        raise UserError(f"{self._path} is not a CIFAR-10 batch file (it uses persistent ids); it was NOT loaded")


def read_cifar_pickle(path: str | os.PathLike) -> dict:
    """Safely unpickle one CIFAR batch / meta file into a dict with ``str`` keys."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            obj = _CifarUnpickler(f, path).load()
    except UserError:
        raise
    except Exception as exc:  # truncated or garbage pickles raise many different types
        raise UserError(f"cannot read {path} as a CIFAR-10 batch ({type(exc).__name__}: {exc}); {_refetch()}") from exc
    if not isinstance(obj, dict):
        raise UserError(f"{path} is not a CIFAR-10 batch file (holds a {type(obj).__name__}, expected a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _load_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = read_cifar_pickle(path)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise UserError(f"{path}: 'data' must be a uint8 N x 3072 array, got {got}; delete it and re-download")
    try:
        labels_arr = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: 'labels' is not a list of integers; delete it and re-download") from exc
    if len(labels_arr) != len(data):
        raise UserError(f"{path} has {len(data)} images but {len(labels_arr)} labels; delete it and re-download")
    if labels_arr.size and (labels_arr.min() < 0 or labels_arr.max() > 9):
        raise UserError(f"{path} contains labels outside 0..9; delete it and re-download")
    return data, labels_arr


def _cifar_split(directory: Path, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [_load_cifar_batch(directory / n) for n in names]
    data = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    labels = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, 32, 32)  # RGB planes, row-major
    return images, torch.from_numpy(labels)


def _cifar_class_names(directory: Path) -> list[str]:
    meta_path = directory / CIFAR10_META_FILE
    if not meta_path.is_file():
        return list(CIFAR10_CLASSES)
    names = read_cifar_pickle(meta_path).get("label_names")
    if not isinstance(names, (list, tuple)) or len(names) != 10:
        raise UserError(f"{meta_path}: 'label_names' must be a list of 10 names; delete it and re-download")
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def _cifar_names(test_only: bool) -> tuple[str, ...]:
    return (CIFAR10_TEST_FILE,) if test_only else (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)


def _missing_cifar(directory: Path, names: tuple[str, ...] | None = None) -> list[str]:
    return [n for n in names or _cifar_names(False) if not (directory / n).is_file()]


def build_cifar10(cfg: DataConfig, test_only: bool = False) -> DataSplits:
    """CIFAR-10 from ``<data_dir>/cifar-10-batches-py`` (python pickles, read without running any code).

    ``test_only``: ``test_batch`` alone (the training batches need not exist; ``train`` is empty).
    """
    root = Path(cfg.data_dir).expanduser().absolute()
    directory = root / CIFAR10_DIR
    names = _cifar_names(test_only)
    missing = _missing_cifar(directory, names)
    if missing and cfg.download:
        import torchvision.datasets as tvd

        _download(
            "cifar10",
            root,
            CIFAR10_DIR,
            lambda staging: tvd.CIFAR10(staging, train=True, download=True),
            f"{', '.join(CIFAR10_TRAIN_FILES)}, {CIFAR10_TEST_FILE} and {CIFAR10_META_FILE} in {directory}",
        )
        missing = _missing_cifar(directory, names)
    if missing:
        raise UserError(
            f"cifar10 not found: expected {', '.join(names)} "
            f"(and optionally {CIFAR10_META_FILE}) in {directory}; missing: {', '.join(missing)}. "
            f"{_fetch_or_place()}"
        )
    if test_only:  # an empty train split of the test split's shape
        x_test, y_test = _cifar_split(directory, (CIFAR10_TEST_FILE,))
        x_train, y_train = x_test[:0], y_test[:0]
    else:
        x_train, y_train = _cifar_split(directory, CIFAR10_TRAIN_FILES)
        x_test, y_test = _cifar_split(directory, (CIFAR10_TEST_FILE,))
    size = cfg.image_size or 32
    x_train, x_test = resize_uint8(x_train, size), resize_uint8(x_test, size)
    transform, augment = None, None
    if cfg.augment is not False:
        transform, augment = crop_flip(cfg, size, scaled_padding(4, 32, size), flip=True)
    class_names = _cifar_class_names(directory)
    info = DatasetInfo(
        name="cifar10",
        num_classes=10,
        in_channels=3,
        image_size=size,
        class_names=class_names,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
    )
    splits = (x_train, y_train), (x_test, y_test)
    return DataSplits.of_tensors(*splits, info, transform, augment=augment, source=str(directory))
