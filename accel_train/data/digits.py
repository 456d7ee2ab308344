"""``digits``: scikit-learn's bundled 1,797 8x8 handwritten digits (no network).

Held as a ``datasets.Dataset`` with a fixed stratified split, then decoded
once into uint8 tensors resized to MNIST's 28x28 so every model takes it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from accel_train.data.base import DataConfig, DatasetInfo, DataSplits, TensorImageDataset
from accel_train.errors import UserError

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed: the split never depends on the training seed
DEFAULT_IMAGE_SIZE = 28


def _read_digits_csv() -> tuple[np.ndarray, np.ndarray]:
    """The file behind ``sklearn.datasets.load_digits``, read without importing scikit-learn.

    ``import sklearn.datasets`` pulls in scipy.stats and most of scikit-learn (0.7 s of a 4 s run) to
    read one 1,797-line CSV; ``find_spec`` locates the installed package without executing it.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the digits dataset ships with scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():  # a scikit-learn that moved its data: let it find the file
        from sklearn.datasets import load_digits

        raw = load_digits()
        return raw.data, raw.target.astype(np.int64)
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_digits_dataset():
    """The raw data as a ``datasets.DatasetDict`` with ``train``/``test`` splits."""
    import datasets

    pixels, labels = _read_digits_csv()
    images = np.round(pixels.reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    names = [str(i) for i in range(10)]
    features = datasets.Features(
        {"image": datasets.Array2D(shape=(8, 8), dtype="uint8"), "label": datasets.ClassLabel(names=names)}
    )
    ds = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    return ds.train_test_split(test_size=DIGITS_TEST_FRACTION, stratify_by_column="label", seed=DIGITS_SPLIT_SEED)


def _to_tensor(split, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    cols = split.with_format("torch")[:]  # one columnar read: {"image": [N, 8, 8], "label": [N]}
    images = cols["image"].unsqueeze(1).float()  # [N, 1, 8, 8]
    if size != images.shape[-1]:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images.round().clamp(0, 255).to(torch.uint8), cols["label"].long()


def build_digits(cfg: DataConfig) -> DataSplits:
    size = cfg.image_size or DEFAULT_IMAGE_SIZE
    dd = load_digits_dataset()
    x_train, y_train = _to_tensor(dd["train"], size)
    x_test, y_test = _to_tensor(dd["test"], size)
    scaled = x_train.float() / 255.0
    info = DatasetInfo(
        name="digits",
        num_classes=10,
        in_channels=1,
        image_size=size,
        class_names=dd["train"].features["label"].names,
        mean=(round(scaled.mean().item(), 4),),
        std=(round(scaled.std().item(), 4),),
    )
    return DataSplits(TensorImageDataset(x_train, y_train), TensorImageDataset(x_test, y_test), info)
