"""Real on-disk formats: MNIST/Fashion-MNIST IDX, CIFAR-10 pickles, image folders, ``save_to_disk`` dirs."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import raises_user_error, snapshot
from datafiles import undecodable_png
from torch.utils.data import DataLoader

from accel_train.config import parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datafiles import (
    CIFAR10_LABEL_NAMES,
    HF_CLASS_NAMES,
    MNIST_NAMES,
    image_folder_with,
    write_cifar10,
    write_hf_disk,
    write_image_folder,
    write_mnist_idx,
)

from accel_train.data import DataConfig, build_dataset, collate_batch
from accel_train.data.base import TensorImageDataset
from accel_train.data.folder import LazyImageDataset
from accel_train.data.folder_index import FileImageDataset
from accel_train.data.vision import read_cifar_pickle, read_idx
from accel_train.errors import UserError

PACKAGE = Path(__file__).resolve().parents[2] / "accel_train"
IDX_FILES = [name for pair in MNIST_NAMES.values() for name in pair]


def _cfg(**kw) -> DataConfig:
    return DataConfig(**kw)


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


# --------------------------------------------------------------------------- MNIST / Fashion-MNIST


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    ("dataset", "subdir", "first_name", "mean"),
    [("mnist", "MNIST", "0", 0.1307), ("fashion_mnist", "FashionMNIST", "T-shirt/top", 0.2860)],
)
def test_idx_datasets_load(tmp_path, gz, dataset, subdir, first_name, mean):
    write_mnist_idx(tmp_path, subdir=subdir, n_train=40, n_test=20, gz=gz)
    splits = build_dataset(_cfg(dataset=dataset, data_dir=str(tmp_path)))
    assert splits.in_memory is True
    assert isinstance(splits.train, TensorImageDataset) and isinstance(splits.test, TensorImageDataset)
    assert splits.train.images.shape == (40, 1, 28, 28) and splits.train.images.dtype == torch.uint8
    assert splits.test.images.shape == (20, 1, 28, 28)
    assert splits.train.labels.tolist() == [i % 10 for i in range(40)]
    info = splits.info
    assert (info.name, info.num_classes, info.in_channels, info.image_size) == (dataset, 10, 1, 28)
    assert len(info.class_names) == 10 and info.class_names[0] == first_name
    assert info.mean == (mean,)
    assert splits.extra["augment"] is None and splits.train.transform is None
    image, label = splits.train[3]
    assert image.shape == (1, 28, 28) and label == 3


def test_idx_pixels_match_file(tmp_path):
    raw = write_mnist_idx(tmp_path)
    expected = read_idx(raw / "train-images-idx3-ubyte", 0x00000803)
    splits = build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))
    assert torch.equal(splits.train.images[:, 0], torch.from_numpy(expected))


def test_mnist_resize_and_augment(tmp_path):
    write_mnist_idx(tmp_path)
    splits = build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path), image_size=32, augment=True))
    assert splits.train.images.shape == (40, 1, 32, 32) and splits.train.images.dtype == torch.uint8
    assert splits.info.image_size == 32
    assert splits.extra["augment"] and "crop" in splits.extra["augment"]
    images, labels = splits.train.__getitems__([0, 1, 2])
    assert images.shape == (3, 1, 32, 32) and images.dtype == torch.uint8 and labels.tolist() == [0, 1, 2]
    assert splits.test.transform is None


@pytest.mark.parametrize("existing", [False, True])
def test_mnist_missing_files_no_download(tmp_path, existing):
    root = tmp_path / "data"
    if existing:
        (root / "MNIST" / "raw").mkdir(parents=True)
        (root / "keep.txt").write_text("x")
    before = _listing(tmp_path)
    with pytest.raises(UserError) as err:
        build_dataset(_cfg(dataset="mnist", data_dir=str(root)))
    message = str(err.value)
    assert "--download" in message and str(root / "MNIST" / "raw") in message
    assert all(name in message for name in IDX_FILES)
    assert _listing(tmp_path) == before
    assert root.exists() == existing


def test_idx_corrupt_magic(tmp_path):
    raw = write_mnist_idx(tmp_path)
    path = raw / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[:4] = (0x00000999).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"corrupt IDX header.*train-images-idx3-ubyte.*0x00000999.*0x00000803"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))


def test_idx_corrupt_gz_magic(tmp_path):
    raw = write_mnist_idx(tmp_path, gz=True)
    path = raw / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + gzip.decompress(path.read_bytes())[4:]))
    with pytest.raises(UserError, match=r"t10k-labels-idx1-ubyte\.gz.*expected 0x00000801.*--download"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))


def test_idx_truncated_and_mismatched(tmp_path):
    raw = write_mnist_idx(tmp_path)
    images = raw / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte.*bytes"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))
    write_mnist_idx(tmp_path)  # repair
    write_mnist_idx(tmp_path / "other", n_train=30)
    os.replace(tmp_path / "other" / "MNIST" / "raw" / "train-labels-idx1-ubyte", raw / "train-labels-idx1-ubyte")
    with pytest.raises(UserError, match=r"40 images but .* 30 labels"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))


def test_idx_not_gzip(tmp_path):
    raw = write_mnist_idx(tmp_path, gz=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"definitely not gzip data")
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte\.gz"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path)))


# --------------------------------------------------------------------------- CIFAR-10


def test_cifar10_loads(tmp_path):
    directory = write_cifar10(tmp_path, n_per_batch=10, n_test=20)
    splits = build_dataset(_cfg(dataset="cifar10", data_dir=str(tmp_path)))
    assert splits.in_memory is True
    assert splits.train.images.shape == (50, 3, 32, 32) and splits.train.images.dtype == torch.uint8
    assert splits.test.images.shape == (20, 3, 32, 32)
    info = splits.info
    assert (info.num_classes, info.in_channels, info.image_size) == (10, 3, 32)
    assert info.class_names == CIFAR10_LABEL_NAMES
    assert info.mean == (0.4914, 0.4822, 0.4465) and info.std == (0.2470, 0.2435, 0.2616)
    # planes are R, G, B: compare against the raw batch
    raw = read_cifar_pickle(directory / "data_batch_1")
    pixel = raw["data"][2].reshape(3, 32, 32)[:, 5, 7]
    assert splits.train.images[2, :, 5, 7].tolist() == pixel.tolist()
    assert splits.train.labels[:10].tolist() == raw["labels"]
    # default augmentation on train only
    assert splits.extra["augment"] == "random_crop(32, padding=4)+hflip"
    assert splits.train.transform is not None and splits.test.transform is None
    image, _ = splits.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8


def test_cifar10_no_meta_no_augment_resize(tmp_path):
    directory = write_cifar10(tmp_path, n_per_batch=4, n_test=6)
    (directory / "batches.meta").unlink()
    splits = build_dataset(_cfg(dataset="cifar10", data_dir=str(tmp_path), augment=False, image_size=24))
    assert splits.info.class_names == CIFAR10_LABEL_NAMES
    assert splits.extra["augment"] is None and splits.train.transform is None
    assert splits.train.images.shape == (20, 3, 24, 24) and splits.info.image_size == 24


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar_pickle_protocols_and_str_keys(tmp_path, protocol):
    path = tmp_path / "batch"
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    with open(path, "wb") as f:
        pickle.dump({"data": data, "labels": [1, 2], b"batch_label": b"x"}, f, protocol=protocol)
    batch = read_cifar_pickle(path)
    assert np.array_equal(batch["data"], data) and batch["labels"] == [1, 2] and batch["batch_label"] == b"x"


class _Evil:
    """Unpickling this creates ``marker`` (if the unpickler lets it)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_cifar_malicious_pickle_refused(tmp_path):
    # the payload really works with an unrestricted unpickler
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps({b"data": _Evil(probe)})).get(b"data").close()
    assert probe.exists()

    directory = write_cifar10(tmp_path / "data")
    marker = tmp_path / "pwned"
    with open(directory / "data_batch_3", "wb") as f:
        pickle.dump({b"data": _Evil(marker), b"labels": [0]}, f, protocol=2)
    with pytest.raises(UserError, match=r"data_batch_3 is not a CIFAR-10 batch.*malicious"):
        build_dataset(_cfg(dataset="cifar10", data_dir=str(tmp_path / "data")))
    assert not marker.exists()


def test_cifar_garbage_file(tmp_path):
    directory = write_cifar10(tmp_path)
    (directory / "test_batch").write_bytes(b"\x80\x02not a pickle at all")
    with pytest.raises(UserError, match=r"test_batch"):
        build_dataset(_cfg(dataset="cifar10", data_dir=str(tmp_path)))


def test_cifar_missing_files(tmp_path):
    root = tmp_path / "nothing-here"
    with pytest.raises(UserError) as err:
        build_dataset(_cfg(dataset="cifar10", data_dir=str(root)))
    message = str(err.value)
    assert "--download" in message and "cifar-10-batches-py" in message
    assert "data_batch_1" in message and "test_batch" in message
    assert not root.exists()


def test_package_never_calls_pickle_load():
    offenders = [str(p) for p in PACKAGE.rglob("*.py") if re.search(r"pickle\.loads?\(", p.read_text(encoding="utf-8"))]
    assert offenders == []


# --------------------------------------------------------------------------- download (offline)


@pytest.fixture
def offline(monkeypatch):
    """Make every torchvision download fail at once, after writing a partial file, like a dropped connection."""
    import torchvision.datasets.utils as tv_utils

    def fail_retrieve(url, filename, *args, **kwargs):
        Path(filename).write_bytes(b"partial")
        raise urllib.error.URLError("simulated: no network")

    monkeypatch.setattr(tv_utils, "_get_redirect_url", lambda url, max_hops=3: url)
    monkeypatch.setattr(tv_utils, "_urlretrieve", fail_retrieve)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist", "cifar10"])
def test_download_failure_cleans_up(tmp_path, offline, dataset):
    root = tmp_path / "new" / "data"
    with pytest.raises(UserError, match=r"downloading \S+ into .* failed") as err:
        build_dataset(_cfg(dataset=dataset, data_dir=str(root), download=True))
    expected_file = "data_batch_1" if dataset == "cifar10" else "train-images-idx3-ubyte"
    assert expected_file in str(err.value) and "network" in str(err.value)
    assert not (tmp_path / "new").exists()


def test_download_failure_keeps_existing_files(tmp_path, offline):
    root = tmp_path / "data"
    (root / "MNIST" / "raw").mkdir(parents=True)
    (root / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"stale")
    (root / "other.txt").write_text("keep me")
    before = _listing(root)
    with pytest.raises(UserError, match="download"):
        build_dataset(_cfg(dataset="mnist", data_dir=str(root), download=True))
    assert _listing(root) == before
    assert (root / "MNIST" / "raw" / "train-images-idx3-ubyte").read_bytes() == b"stale"


def test_download_success_loads_with_own_parser(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    calls = []

    class FakeMNIST:
        def __init__(self, root, train=True, download=False):
            calls.append((root, train, download))
            write_mnist_idx(root, gz=True)
            Path(root, "mnist.tar.gz").write_bytes(b"an archive torchvision keeps")

    monkeypatch.setattr(tvd, "MNIST", FakeMNIST)
    splits = build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path), download=True))
    [(staging, train, download)] = calls  # staged beside the data, then moved in
    assert (Path(staging).parent, train, download) == (tmp_path, True, True)
    assert _listing(tmp_path) == ["MNIST", "MNIST/raw", *sorted(f"MNIST/raw/{n}.gz" for n in IDX_FILES)]
    assert splits.train.images.shape == (40, 1, 28, 28)
    # files present: no second download
    build_dataset(_cfg(dataset="mnist", data_dir=str(tmp_path), download=True))
    assert len(calls) == 1


# --------------------------------------------------------------------------- image folders


def _all_samples(ds) -> tuple[torch.Tensor, list[int]]:
    items = [ds[i] for i in range(len(ds))]
    return torch.stack([x for x, _ in items]), [y for _, y in items]


def test_imagefolder_stratified_split(tmp_path):
    root = write_image_folder(tmp_path / "imgs", classes=("a", "b", "c"), per_class=6, size=16)
    splits = build_dataset(_cfg(dataset=f"imagefolder:{root}", val_split=0.2, seed=3))
    assert splits.in_memory is False
    assert isinstance(splits.train, FileImageDataset)
    assert (len(splits.train), len(splits.test)) == (14, 4)  # datasets' train_test_split: ceil(0.2 * 18) to test
    info = splits.info
    assert (info.num_classes, info.in_channels, info.image_size) == (3, 3, 16)
    assert info.class_names == ["a", "b", "c"]
    assert len(info.mean) == 3 and len(info.std) == 3 and all(s > 0 for s in info.std)
    assert splits.extra["source"] == str(root.absolute())
    image, label = splits.train[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and isinstance(label, int)
    _, test_labels = _all_samples(splits.test)
    assert sorted(test_labels.count(c) for c in range(3)) == [1, 1, 2]  # stratified: 4 images over 3 classes

    again = build_dataset(_cfg(dataset=f"imagefolder:{root}", val_split=0.2, seed=3))
    x1, y1 = _all_samples(splits.test)
    x2, y2 = _all_samples(again.test)
    assert torch.equal(x1, x2) and y1 == y2
    other = build_dataset(_cfg(dataset=f"imagefolder:{root}", val_split=0.2, seed=4))
    assert not torch.equal(_all_samples(other.test)[0], x1)


def test_imagefolder_with_splits_gray(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=4, size=12, with_splits=True, mode="L")
    splits = build_dataset(_cfg(dataset=f"imagefolder:{root}"))
    assert (len(splits.train), len(splits.test)) == (12, 6)
    assert splits.info.in_channels == 1 and splits.info.image_size == 12
    images, labels = next(iter(DataLoader(splits.test, batch_size=4, collate_fn=collate_batch)))
    assert images.shape == (4, 1, 12, 12) and images.dtype == torch.uint8 and labels.dtype == torch.int64


def test_imagefolder_mixed_sizes_and_requested_size(tmp_path):
    from PIL import Image

    root = write_image_folder(tmp_path / "imgs", classes=("x", "y"), per_class=3, size=16)
    for i in range(3):  # more than the split can send to test: the training images differ in size
        Image.new("RGB", (20, 10), (10, 20, 30)).save(root / "x" / f"odd{i}.png")
    splits = build_dataset(_cfg(dataset=f"imagefolder:{root}", val_split=0.25))
    assert splits.info.image_size == 64 and splits.train[0][0].shape == (3, 64, 64)
    splits = build_dataset(_cfg(dataset=f"imagefolder:{root}", val_split=0.25, image_size=8, augment=True))
    assert splits.info.image_size == 8 and splits.train[0][0].shape == (3, 8, 8)
    assert splits.extra["augment"] and splits.test.transform is None


def test_imagefolder_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        build_dataset(_cfg(dataset=f"imagefolder:{tmp_path / 'missing'}"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty folder"):
        build_dataset(_cfg(dataset=f"imagefolder:{tmp_path / 'empty'}"))
    (tmp_path / "empty2" / "a").mkdir(parents=True)
    (tmp_path / "empty2" / "a" / "notes.txt").write_text("no images")
    with pytest.raises(UserError, match="empty folder"):
        build_dataset(_cfg(dataset=f"imagefolder:{tmp_path / 'empty2'}"))
    one = write_image_folder(tmp_path / "one", classes=("only",), per_class=3)
    with pytest.raises(UserError, match="need at least 2 classes"):
        build_dataset(_cfg(dataset=f"imagefolder:{one}"))


# --------------------------------------------------------------------------- datasets save_to_disk / hub


def test_hf_disk_dict(tmp_path):
    path = write_hf_disk(tmp_path / "hf", n=30)
    splits = build_dataset(_cfg(dataset=f"hf:{path}"))
    assert splits.in_memory is True
    assert splits.train.images.shape == (30, 3, 16, 16) and splits.train.images.dtype == torch.uint8
    assert splits.test.images.shape == (10, 3, 16, 16)
    assert splits.info.class_names == HF_CLASS_NAMES and splits.info.num_classes == 3
    assert splits.train.labels.tolist() == [i % 3 for i in range(30)]
    red = splits.train.images[0].float().mean(dim=(1, 2))
    assert red[0] > red[1] and red[0] > red[2]


def test_hf_disk_plain_dataset_split(tmp_path):
    path = write_hf_disk(tmp_path / "hf", n=30, splits=False)
    splits = build_dataset(_cfg(dataset=f"hf:{path}", val_split=0.2, image_size=8))
    assert (len(splits.train), len(splits.test)) == (24, 6)
    assert splits.train.images.shape == (24, 3, 8, 8)
    again = build_dataset(_cfg(dataset=f"hf:{path}", val_split=0.2, image_size=8))
    assert torch.equal(splits.test.images, again.test.images)


def test_hf_lazy_matches_in_memory(tmp_path, monkeypatch):
    import accel_train.data.hf as hf

    path = write_hf_disk(tmp_path / "hf", n=12)
    eager = build_dataset(_cfg(dataset=f"hf:{path}"))
    monkeypatch.setattr(hf, "MAX_IN_MEMORY_SAMPLES", 5)
    lazy = build_dataset(_cfg(dataset=f"hf:{path}"))
    assert lazy.in_memory is False and isinstance(lazy.train, LazyImageDataset)
    images, labels = _all_samples(lazy.train)
    assert torch.equal(images, eager.train.images) and labels == eager.train.labels.tolist()


def test_hf_array_images_and_string_labels(tmp_path):
    import datasets

    rng = np.random.default_rng(0)
    ds = datasets.Dataset.from_dict(
        {"img": rng.integers(0, 256, size=(20, 10, 10), dtype=np.uint8).tolist(), "kind": ["dog", "cat"] * 10},
        features=datasets.Features({"img": datasets.Array2D((10, 10), "uint8"), "kind": datasets.Value("string")}),
    )
    ds.save_to_disk(str(tmp_path / "arr"))
    splits = build_dataset(_cfg(dataset=f"hf:{tmp_path / 'arr'}", label_column="kind", val_split=0.5))
    assert splits.info.class_names == ["cat", "dog"] and splits.info.in_channels == 1
    assert splits.train.images.shape == (10, 1, 10, 10)
    assert sorted(splits.train.labels.tolist()) == [0] * 5 + [1] * 5


def test_hf_missing_column(tmp_path):
    path = write_hf_disk(tmp_path / "hf", n=9)
    with pytest.raises(UserError, match=r"label column 'nope' not found; available columns: image, label"):
        build_dataset(_cfg(dataset=f"hf:{path}", label_column="nope"))
    with pytest.raises(UserError, match=r"image column 'pic' not found.*image, label"):
        build_dataset(_cfg(dataset=f"hf:{path}", image_column="pic"))
    import datasets

    datasets.Dataset.from_dict({"pixels": [[0, 1]] * 4, "y": [0, 1] * 2}).save_to_disk(str(tmp_path / "cols"))
    with pytest.raises(UserError, match=r"no image column found.*available columns: pixels, y"):
        build_dataset(_cfg(dataset=f"hf:{tmp_path / 'cols'}"))


def test_hf_hub_offline(monkeypatch):
    import datasets

    def no_network(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/some-dataset' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(UserError, match=r"not in the local cache.*no network"):
        build_dataset(_cfg(dataset="hf:someone/some-dataset"))


def test_hf_missing_local_dir(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        build_dataset(_cfg(dataset=f"hf:{tmp_path / 'nope'}"))


# ---- evaluation reads the test split alone ---------------------------------------------------------------------------


def test_cifar10_test_only_needs_only_test_batch(tmp_path):
    from accel_train.data import build_dataset

    directory = write_cifar10(tmp_path, n_per_batch=4, n_test=6)
    (directory / "data_batch_3").unlink()
    cfg = parse_config(["--dataset", "cifar10", "--data-dir", str(tmp_path)]).data_config()
    splits = build_dataset(cfg, test_only=True)
    assert len(splits.test) == 6 and len(splits.train) == 0
    assert splits.train.images.shape[1:] == splits.test.images.shape[1:] == (3, 32, 32)
    raises_user_error(lambda: build_dataset(cfg), "missing: data_batch_3", "with --download")


# ---- image folders load quietly --------------------------------------------------------------------------------------


def test_imagefolder_loads_quietly_and_restores_datasets_settings(tmp_path, capfd):
    import datasets

    from accel_train.data import build_dataset

    root = write_image_folder(tmp_path / "images", per_class=4, size=8)
    bars_off, verbosity = datasets.are_progress_bars_disabled(), datasets.utils.logging.get_verbosity()
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    splits = build_dataset(cfg)
    assert len(splits.train) + len(splits.test) == 12
    captured = capfd.readouterr()
    assert "Downloading data" not in captured.err + captured.out
    assert "Generating train split" not in captured.err + captured.out
    assert datasets.are_progress_bars_disabled() == bars_off
    assert datasets.utils.logging.get_verbosity() == verbosity


# ---- image folders: unreadable images, other files, mixed modes, loops -----------------------------------------------


@pytest.mark.parametrize(
    "bad,needles",
    [
        (["corrupt"], ["1 of 9 image files cannot be read", "a/corrupt.png"]),
        (["empty"], ["1 of 9 image files cannot be read", "b/empty.png (empty (0 bytes))"]),
        (["text"], ["1 of 9 image files cannot be read", "b/readme.jpg (not an image file"]),
        (
            ["corrupt", "empty", "text"],
            ["3 of 11 image files cannot be read", "corrupt.png", "empty.png", "readme.jpg"],
        ),
    ],
    ids=["corrupt-png", "zero-bytes", "text-file", "all-three"],
)
def test_imagefolder_unreadable_images_in_process(tmp_path, bad, needles):
    from accel_train.data import build_dataset

    root = image_folder_with(tmp_path, *bad)
    before = snapshot(tmp_path)
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    message = raises_user_error(lambda: build_dataset(cfg), str(root), *needles, "remove or replace them")
    assert message.startswith(f"{root}: ")
    assert snapshot(tmp_path) == before


def test_imagefolder_leaves_out_other_files_in_one_line(tmp_path):
    """Files that are not images by their extension are not indexed, never silently: one line counts them by
    extension and names one; a class folder that holds only such files (HEIC photos) is left out in that line."""
    from accel_train.data import build_dataset

    root = image_folder_with(tmp_path)
    (root / "a" / "notes.txt").write_text("not an image, not an image extension: not indexed\n")
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
    assert len(splits.train) + len(splits.test) == 8
    (line,) = splits.extra["notes"]
    assert "1 file(s)" in line and "1 .txt" in line and "a/notes.txt" in line, line
    (root / "phone").mkdir()
    for i in range(3):
        (root / "phone" / f"IMG_{i}.HEIC").write_bytes(b"\0" * 10)
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
    assert "phone" not in splits.info.class_names
    (line,) = splits.extra["notes"]
    assert "4 file(s)" in line and "3 .heic" in line and "left out: phone" in line, line


def test_imagefolder_of_mixed_modes_says_how_they_are_converted(tmp_path):
    from PIL import Image

    from accel_train.data import build_dataset

    root = write_image_folder(tmp_path / "images", classes=("a", "b"), per_class=4, size=16, mode="L")
    for path in sorted(root.glob("b/*.png"))[:2]:
        Image.open(path).convert("RGBA").save(path)
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
    assert splits.info.in_channels == 3  # colour wins: nothing is lost converting grayscale to RGB
    (note,) = splits.extra["notes"]
    assert "\n" not in note and f"{root} mixes image modes (L: 6, RGBA: 2)" in note
    assert "every image is converted to RGB (3 channels); alpha channels are dropped" in note


def test_imagefolder_image_that_only_fails_to_decode(tmp_path):
    """Checksums valid, pixels not: the up-front check passes it; decoding it (for the statistics the build
    estimates, or as a sample in an epoch) is one line naming the file."""
    from accel_train.data import build_dataset

    root = image_folder_with(tmp_path)
    bad = undecodable_png(root / "a" / "a_001.png")

    def read_everything():
        splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
        for dataset in (splits.train, splits.test):
            for index in range(len(dataset)):
                dataset[index]

    raises_user_error(read_everything, f"cannot decode image {bad}", "broken data stream", "remove or replace it")


def test_imagefolder_with_a_directory_loop(tmp_path):
    from accel_train.data import build_dataset

    root = image_folder_with(tmp_path)
    (root / "a" / "loop").symlink_to(root)
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    raises_user_error(lambda: build_dataset(cfg), "links back to", "a directory loop")


# --------------------------------------------------------------------------- digits: the shipped split


def test_the_shipped_digits_split_is_datasets_own_split():
    """digits_split.json holds what datasets' stratified train_test_split gives these data: a run that reads it
    trains on exactly the samples (in exactly the order) it did when it split with datasets."""
    from accel_train.data import digits

    images, labels = digits._digits_arrays()
    shipped = json.loads(digits.SPLIT_FILE.read_text())
    assert shipped["fingerprint"] == digits.fingerprint(images, labels), "regenerate: " + shipped["about"]
    reference = digits.reference_split(images, labels)
    assert {k: shipped[k] for k in ("train", "test")} == reference, "regenerate: " + shipped["about"]


def test_digits_data_other_than_the_fingerprint_are_split_by_datasets(monkeypatch, tmp_path):
    from accel_train.data import digits

    images, labels = digits._digits_arrays()
    stale = json.loads(digits.SPLIT_FILE.read_text())
    stale["train"], stale["test"] = stale["train"][::-1], stale["test"][::-1]  # indices of some other data
    stale["fingerprint"] = "0" * 64
    monkeypatch.setattr(digits, "SPLIT_FILE", tmp_path / "digits_split.json")
    digits.SPLIT_FILE.write_text(json.dumps(stale))
    assert digits.digits_split(images, labels) == digits.reference_split(images, labels)
    digits.SPLIT_FILE.unlink()  # no file at all: the same
    assert digits.digits_split(images, labels) == digits.reference_split(images, labels)


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_augment_crops_the_in_memory_sources_too(dataset):
    """--augment on digits (the default dataset) and synthetic was silently ignored: the run trained on the same
    images as without it. Now they crop as MNIST does (2 pixels at 28x28, no flip), training split only, keyed
    on (seed, epoch, index) like every augmentation; without --augment nothing changes."""
    size = 28 if dataset == "digits" else 16
    plain = build_dataset(_cfg(dataset=dataset, synthetic_image_size=size))
    aug = build_dataset(_cfg(dataset=dataset, synthetic_image_size=size, augment=True))
    assert plain.extra.get("augment") is None and plain.train.transform is None
    assert aug.extra["augment"] == f"random_crop({size}, padding={round(2 * size / 28)})"
    assert aug.test.transform is None
    aug.train.augment_seed = 0
    indices = list(range(64))
    raw, labels = plain.train.__getitems__(indices)
    cropped, aug_labels = aug.train.__getitems__(indices)
    assert torch.equal(labels, aug_labels) and cropped.shape == raw.shape and cropped.dtype == torch.uint8
    assert not torch.equal(cropped, raw)
    assert torch.equal(aug.train.__getitems__(indices)[0], cropped)  # keyed: the same batch again


@pytest.mark.parametrize("seed", [0, 3, 42])
def test_stratified_split_is_datasets_train_test_split(seed):
    """base.stratified_split runs datasets' stratified algorithm on the labels alone: the same indices as
    ``Dataset.train_test_split(stratify_by_column=...)`` (what earlier versions called, so a resumed run keeps its
    split), for uneven classes, odd fractions and a class too small to split."""
    import datasets

    from accel_train.data.base import stratified_split

    gen = torch.Generator().manual_seed(seed)
    for n, k, fraction in ((17, 3, 0.2), (250, 7, 0.33), (1000, 10, 0.05), (40, 2, 0.5), (9, 5, 0.2)):
        labels = torch.randint(0, k, (n,), generator=gen) * 3 - 1
        classes, codes = torch.unique(labels, return_inverse=True)
        table = datasets.Dataset.from_dict(
            {"i": list(range(n)), "y": codes.tolist()},
            features=datasets.Features({"i": datasets.Value("int64"), "y": datasets.ClassLabel(len(classes))}),
        )
        try:
            split = table.train_test_split(fraction, stratify_by_column="y", seed=seed, keep_in_memory=True)
            expected = sorted(split["train"]["i"]), sorted(split["test"]["i"])
        except ValueError:
            expected = [], []
        train, test = stratified_split(labels, fraction, seed)
        assert (train.tolist(), test.tolist()) == expected, (n, k, fraction)
