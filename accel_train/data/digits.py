"""``digits``: scikit-learn's bundled 1,797 8x8 handwritten digits (no network).

Split once by ``datasets``' stratified ``train_test_split`` (seed 0, 20% test), then decoded into uint8 tensors
resized to MNIST's 28x28 so every model takes it. The split's indices ship beside this file
(``digits_split.json``, with a fingerprint of the data they split): a run uses them without importing
``datasets`` (pandas, pyarrow, fsspec: about a second before the first step, issue 29), and splits with
``datasets`` itself whenever the installed data differ from the fingerprint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from accel_train.data.augment import opt_in_crop
from accel_train.data.base import DataConfig, DatasetInfo, DataSplits
from accel_train.errors import UserError

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed: the split never depends on the training seed
DEFAULT_IMAGE_SIZE = 28
SPLIT_FILE = Path(__file__).with_name("digits_split.json")
CLASS_NAMES = [str(i) for i in range(10)]


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


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as uint8 ``[N, 8, 8]`` (0..16 scaled to 0..255) and their int64 labels."""
    pixels, labels = _read_digits_csv()
    return np.round(pixels.reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8), labels


def fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(images.tobytes() + labels.astype(np.int64).tobytes()).hexdigest()


def _split_by_datasets(images: np.ndarray, labels: np.ndarray):
    """``datasets``' stratified split of these arrays, with each row's index in a ``row`` column."""
    import datasets

    features = datasets.Features(
        {
            "image": datasets.Array2D(shape=(8, 8), dtype="uint8"),
            "label": datasets.ClassLabel(names=CLASS_NAMES),
            "row": datasets.Value("int64"),
        }
    )
    ds = datasets.Dataset.from_dict({"image": images, "label": labels, "row": range(len(labels))}, features=features)
    return ds.train_test_split(test_size=DIGITS_TEST_FRACTION, stratify_by_column="label", seed=DIGITS_SPLIT_SEED)


def load_digits_dataset():
    """The raw data as a ``datasets.DatasetDict`` with ``train``/``test`` splits: the reference split."""
    return _split_by_datasets(*_digits_arrays())


def reference_split(images: np.ndarray, labels: np.ndarray) -> dict[str, list[int]]:
    """The split's row indices, in the order ``datasets`` returns the rows, computed by ``datasets``."""
    dd = _split_by_datasets(images, labels)
    return {name: [int(i) for i in dd[name]["row"]] for name in ("train", "test")}


def digits_split(images: np.ndarray, labels: np.ndarray) -> dict[str, list[int]]:
    """The shipped indices where they split these very data; ``datasets``' own split otherwise."""
    try:
        shipped = json.loads(SPLIT_FILE.read_text())
    except (OSError, ValueError):
        shipped = {}
    if shipped.get("fingerprint") == fingerprint(images, labels):
        return {"train": shipped["train"], "test": shipped["test"]}
    return reference_split(images, labels)


def _to_tensor(images: np.ndarray, labels: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(images).unsqueeze(1).float()  # [N, 1, 8, 8]
    if size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8), torch.from_numpy(labels).long()


def build_digits(cfg: DataConfig) -> DataSplits:
    size = cfg.image_size or DEFAULT_IMAGE_SIZE
    images, labels = _digits_arrays()
    split = digits_split(images, labels)
    x_train, y_train = _to_tensor(images[split["train"]], labels[split["train"]], size)
    x_test, y_test = _to_tensor(images[split["test"]], labels[split["test"]], size)
    scaled = x_train.float() / 255.0
    info = DatasetInfo(
        name="digits",
        num_classes=10,
        in_channels=1,
        image_size=size,
        class_names=list(CLASS_NAMES),
        mean=(round(scaled.mean().item(), 4),),
        std=(round(scaled.std().item(), 4),),
    )
    transform, augment = opt_in_crop(cfg, size)
    return DataSplits.of_tensors((x_train, y_train), (x_test, y_test), info, transform, augment=augment)


def write_split_file() -> None:
    """Regenerate ``digits_split.json`` from ``datasets``' split (tests/unit check it matches)."""
    images, labels = _digits_arrays()
    split = reference_split(images, labels)
    about = (
        "datasets' stratified train_test_split(test_size=0.2, seed=0) of scikit-learn's digits; regenerate with: "
        "python3 -c 'from accel_train.data.digits import write_split_file; write_split_file()'"
    )
    body = {"about": about, "fingerprint": fingerprint(images, labels), **split}
    SPLIT_FILE.write_text(json.dumps(body, separators=(",", ":")) + "\n")
