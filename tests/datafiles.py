"""Writers for tiny datasets in their real on-disk formats (for data and end-to-end tests).

Every writer is deterministic and makes learnable data: each class has its own
pattern (a bright bar at a class-specific position or a class-specific colour)
plus mild noise, so a small model can fit a few dozen samples.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.data.folders import write_shapes_folder  # noqa: F401  (drawn shapes: tests and the benchmark share it)

MNIST_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR10_LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
HF_CLASS_NAMES = ["red", "green", "blue"]
_COLOURS = [
    (220, 40, 40),
    (40, 200, 60),
    (40, 60, 220),
    (230, 200, 40),
    (200, 60, 200),
    (40, 200, 200),
    (250, 250, 250),
    (20, 20, 20),
    (240, 140, 20),
    (120, 70, 20),
]


def _gray_patterns(labels: np.ndarray, size: int, classes: int, seed: int) -> np.ndarray:
    """uint8 [N, size, size]: a bright horizontal bar whose row depends on the label, plus noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 40, size=(len(labels), size, size), dtype=np.uint8)
    band = max(1, size // classes)
    for i, label in enumerate(labels):
        row = int(label) * band
        images[i, row : row + band, 2 : size - 2] = 200 + rng.integers(0, 55)
    return images


def _colour_images(labels: np.ndarray, size: int, seed: int, gray: bool = False) -> np.ndarray:
    """uint8 [N, size, size, 3] (or [N, size, size] when ``gray``): a class colour (or gray level) plus noise."""
    rng = np.random.default_rng(seed)
    if gray:
        levels = np.array([30 + (int(lbl) * 45) % 210 for lbl in labels], dtype=np.int16)[:, None, None]
        noise = rng.integers(-15, 16, size=(len(labels), size, size), dtype=np.int16)
        return np.clip(levels + noise, 0, 255).astype(np.uint8)
    base = np.array([_COLOURS[int(lbl) % len(_COLOURS)] for lbl in labels], dtype=np.int16)[:, None, None, :]
    noise = rng.integers(-20, 21, size=(len(labels), size, size, 3), dtype=np.int16)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_idx(path: str | Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write a uint8 array as an IDX file (magic 0x0000080<ndim>); ``.gz`` appended when ``gz``."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    path = Path(path)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_mnist_idx(
    root: str | Path, subdir: str = "MNIST", n_train: int = 40, n_test: int = 20, gz: bool = False
) -> Path:
    """Write ``<root>/<subdir>/raw/{train,t10k}-*-ubyte[.gz]`` (28x28, labels ``i % 10``); returns the raw dir."""
    raw = Path(root) / subdir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images_name, labels_name = MNIST_NAMES[split]
        write_idx(raw / images_name, _gray_patterns(labels, 28, 10, seed), gz=gz)
        write_idx(raw / labels_name, labels, gz=gz)
    return raw


def write_cifar10(root: str | Path, n_per_batch: int = 10, n_test: int = 20, protocol: int = 2) -> Path:
    """Write ``<root>/cifar-10-batches-py`` like the official (Python 2, bytes-keyed) pickles; returns that dir.

    ``data`` is uint8 ``N x 3072`` (R, G, B planes of 32x32), ``labels`` a list of ints (``i % 10``).
    """
    directory = Path(root) / "cifar-10-batches-py"
    directory.mkdir(parents=True, exist_ok=True)
    batches = [(f"data_batch_{i}", n_per_batch, i, f"training batch {i} of 5") for i in range(1, 6)]
    batches.append(("test_batch", n_test, 0, "testing batch 1 of 1"))
    for name, n, seed, title in batches:
        labels = [int(i % 10) for i in range(n)]
        hwc = _colour_images(np.array(labels), 32, seed=100 + seed)
        data = hwc.transpose(0, 3, 1, 2).reshape(n, 3072)  # RGB planes, as in the real files
        batch = {
            b"batch_label": title.encode(),
            b"labels": labels,
            b"data": np.ascontiguousarray(data),
            b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)],
        }
        with open(directory / name, "wb") as f:
            pickle.dump(batch, f, protocol=protocol)
    meta = {
        b"num_cases_per_batch": n_per_batch,
        b"label_names": [n.encode() for n in CIFAR10_LABEL_NAMES],
        b"num_vis": 3072,
    }
    with open(directory / "batches.meta", "wb") as f:
        pickle.dump(meta, f, protocol=protocol)
    return directory


def _write_pngs(directory: Path, classes: Sequence[str], per_class: int, size: int, mode: str, seed: int) -> None:
    from PIL import Image

    for c, name in enumerate(classes):
        class_dir = directory / name
        class_dir.mkdir(parents=True, exist_ok=True)
        images = _colour_images(np.full(per_class, c), size, seed=seed + c, gray=mode == "L")
        for i, arr in enumerate(images):
            Image.fromarray(arr).convert(mode).save(class_dir / f"{name}_{i:03d}.png")


def write_image_folder(
    root: str | Path,
    classes: Sequence[str] = ("a", "b", "c"),
    per_class: int = 6,
    size: int = 16,
    with_splits: bool = False,
    mode: str = "RGB",
) -> Path:
    """Write PNGs as ``<root>/<class>/*.png``; with ``with_splits``: ``<root>/train/<class>/`` (``per_class``
    each) and ``<root>/test/<class>/`` (``max(1, per_class // 2)`` each). ``mode`` is a PIL mode ("RGB", "L")."""
    root = Path(root)
    if with_splits:
        _write_pngs(root / "train", classes, per_class, size, mode, seed=10)
        _write_pngs(root / "test", classes, max(1, per_class // 2), size, mode, seed=20)
    else:
        _write_pngs(root, classes, per_class, size, mode, seed=10)
    return root


def write_hf_disk(path: str | Path, n: int = 30, splits: bool = True, size: int = 16) -> Path:
    """``save_to_disk`` a dataset with an ``image`` (datasets.Image, RGB PNG) and a ClassLabel ``label`` column.

    With ``splits`` a ``DatasetDict`` (``train``: ``n`` rows, ``test``: ``max(3, n // 3)`` rows), otherwise a
    plain ``Dataset`` of ``n`` rows. Classes: ``HF_CLASS_NAMES``, label ``i % 3``.
    """
    import datasets
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=HF_CLASS_NAMES)})

    def make(rows: int, seed: int) -> datasets.Dataset:
        labels = np.arange(rows) % len(HF_CLASS_NAMES)
        images = [Image.fromarray(a) for a in _colour_images(labels, size, seed=seed)]
        return datasets.Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features)

    data = datasets.DatasetDict({"train": make(n, 1), "test": make(max(3, n // 3), 2)}) if splits else make(n, 1)
    data.save_to_disk(str(path))
    return Path(path)


def undecodable_png(path: str | Path) -> Path:
    """Damage a PNG so that only decoding its pixels fails: the IDAT data is zeros (not zlib), its checksum valid.

    Opening it and ``verify()`` (the up-front check of an image folder) pass; converting it raises OSError.
    """
    path = Path(path)
    data = path.read_bytes()
    start = data.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", data[start : start + 4])
    body = bytes(length)
    crc = struct.pack(">I", zlib.crc32(b"IDAT" + body))
    path.write_bytes(data[: start + 8] + body + crc + data[start + 12 + length :])
    return path


def image_folder_with(parent: Path, *bad: str) -> Path:
    """``parent/images``: classes a and b, 4 PNGs each (16x16), plus the ``bad`` files named: "corrupt" (a
    truncated PNG that fails verify()), "empty" (an empty .png), "text" (a .jpg that holds text)."""
    root = write_image_folder(parent / "images", classes=("a", "b"), per_class=4, size=16)
    good = (root / "a" / "a_000.png").read_bytes()
    for name in bad:
        if name == "corrupt":
            (root / "a" / "corrupt.png").write_bytes(good[: len(good) // 2])  # truncated: fails verify()
        elif name == "empty":
            (root / "b" / "empty.png").write_bytes(b"")
        elif name == "text":
            (root / "b" / "readme.jpg").write_text("this is not an image\n")
    return root


def age(*roots: str | Path, seconds: int = 3600) -> None:
    """Date every file and folder under ``roots`` (and the roots) ``seconds`` back, links themselves not followed:
    data nobody touched lately, which the index cache stores (content changed within 2 s is not cached)."""
    then = time.time_ns() - seconds * 10**9
    for root in roots:
        for path in [Path(root), *Path(root).rglob("*")]:
            os.utime(path, ns=(then, then), follow_symlinks=False)
