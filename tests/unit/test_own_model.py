"""Issue 14, items 1 and 2: any torchvision model, your own model code, and the Python API ``accel_train.train``.

The in-process tests; whole runs and launches are in ../integration/test_own_model_runs.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import summary
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from accel_train.checkpoint.weights import load_model, load_weights
from accel_train.errors import UserError
from accel_train.models import check_model_name, create_model, min_image_size


def test_torchvision_names_sizes_and_channels():
    check_model_name("tv:resnet50")  # known
    with pytest.raises(UserError, match=r"unknown torchvision model tv:resnet5 \(did you mean tv:resnet50"):
        check_model_name("tv:resnet5")
    with pytest.raises(UserError, match=r"needs images of at least 63x63, got 28x28; resize them with --image-size 63"):
        create_model("tv:alexnet", 10, 1, 28)
    with pytest.raises(UserError, match=r"cannot take 40x40 images .*--image-size 48"):
        create_model("tv:vit_b_16", 10, 3, 40)  # ViT takes multiples of its patch only
    assert min_image_size("tv:alexnet") == 63 and min_image_size("tv:inception_v3") == 75
    model = create_model("tv:vit_b_16", 7, 1, 32)  # the image size reaches the constructor
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 7)
    model = create_model("tv:googlenet", 5, 4, 32).train()  # no auxiliary heads: training mode gives logits
    assert isinstance(model(torch.zeros(2, 4, 32, 32)), torch.Tensor)


def test_too_small_images_for_a_torchvision_model_are_refused_before_loading(tmp_path):
    from accel_train.config import parse_config

    with pytest.raises(UserError, match=r"--synthetic-image-size 16 is too small for --model tv:alexnet.*63x63"):
        parse_config(["--model", "tv:alexnet", "--dataset", "synthetic", "--synthetic-image-size", "16"])


def test_user_model_errors_say_what_to_do(tmp_path):
    with pytest.raises(UserError, match=r"unknown model 'mymodel'.*package\.module:callable"):
        check_model_name("mymodel")
    check_model_name("no_such_package.models:build")  # spelling only: nothing is imported
    with pytest.raises(UserError, match=r"cannot import no_such_package\.models .*PYTHONPATH"):
        create_model("no_such_package.models:build")
    with pytest.raises(UserError, match=r"torch\.nn has no 'Nope'"):
        create_model("torch.nn:Nope")


class Net(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))

    def forward(self, x):
        return self.net(x)


class PILDigits(Dataset):
    """A user's Dataset: PIL images of varying polarity-free content and int labels, with ``classes``."""

    classes = ["zero", "one", "two"]

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(n)
        self.labels = torch.randint(0, 3, (n,), generator=g)
        self.noise = torch.rand(n, 12, 12, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        label = int(self.labels[i])
        pixels = (self.noise[i] * 80 + label * 80).clamp(0, 255).to(torch.uint8).numpy()
        return Image.fromarray(pixels, mode="L"), label


OPTIONS = {"max_steps": 6, "batch_size": 16, "report_to": "none", "plots": False, "progress": False}


def test_api_trains_a_module_instance_on_a_users_dataset(tmp_path):
    import accel_train

    out = tmp_path / "run"
    result = accel_train.train(Net(3, 1, 12), PILDigits(96), PILDigits(32), output_dir=str(out), **OPTIONS)
    assert result["global_step"] == 6 and summary(out)["global_step"] == 6
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["class_names"] == ["zero", "one", "two"] and config["dataset"] == "custom"
    assert config["model"] == f"instance:{Net.__module__}.Net"
    with pytest.raises(UserError, match=r"was an nn\.Module object .*load_weights\(model, path\)"):
        load_model(out / "model", allow_import=True)
    load_weights(Net(3, 1, 12), out / "model")  # the weights fit the user's own module


def test_api_builds_a_class_seeded_and_splits_tensors(tmp_path):
    import accel_train

    images = torch.rand(120, 1, 16, 16)  # ToTensor-style floats in [0, 1]
    labels = torch.arange(120) % 4
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        accel_train.train(Net, TensorDataset(images, labels), output_dir=str(out), val_split=0.25, **OPTIONS)
        runs.append(load_model(out / "model", allow_import=True)[0])  # importable by name: rebuilt from config
    config = json.loads((tmp_path / "a" / "model" / "config.json").read_text())
    assert config["model"] == f"{Net.__module__}:Net"
    assert config["num_classes"] == 4
    assert summary(tmp_path / "a")["eval_samples"] == 30  # val_split of the training set
    for a, b in zip(runs[0].state_dict().values(), runs[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)  # built by the loop after seeding: the same run twice


def test_api_takes_a_hugging_face_dataset_and_a_model_name(tmp_path):
    import datasets
    import numpy as np

    import accel_train

    rng = np.random.default_rng(0)
    features = datasets.Features(
        {"image": datasets.Array2D(shape=(16, 16), dtype="uint8"), "label": datasets.ClassLabel(names=["a", "b"])}
    )
    data = datasets.Dataset.from_dict(
        {"image": rng.integers(0, 255, (64, 16, 16), dtype=np.uint8), "label": rng.integers(0, 2, 64)},
        features=features,
    )
    out = tmp_path / "run"
    accel_train.train("lenet", data, output_dir=str(out), **{**OPTIONS, "max_steps": 2})
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model"] == "lenet" and config["class_names"] == ["a", "b"] and config["image_size"] == 16
    load_model(out / "model")


def test_api_runs_twice_in_one_session_with_another_precision(tmp_path):
    """A notebook trains fp32, then bf16: accelerate alone would refuse the second ("restart your runtime")."""
    import accel_train

    images, labels = torch.rand(64, 1, 16, 16), torch.arange(64) % 4
    for i, precision in enumerate(("no", "bf16", "no")):
        out = tmp_path / f"{i}_{precision}"
        accel_train.train(Net, TensorDataset(images, labels), output_dir=str(out), mixed_precision=precision, **OPTIONS)
        assert summary(out)["mixed_precision"] == precision and summary(out)["global_step"] == 6


def test_api_errors_say_what_to_do(tmp_path):
    import accel_train

    data = TensorDataset(torch.rand(40, 1, 16, 16), torch.arange(40) % 2)
    with pytest.raises(UserError, match=r"unknown option 'epoch' \(did you mean epochs\?\)"):
        accel_train.train(Net, data, epoch=3)
    with pytest.raises(UserError, match="option max_steps must be int"):
        accel_train.train(Net, data, max_steps="3")
    normalised = TensorDataset(torch.randn(40, 1, 16, 16), torch.arange(40) % 2)
    with pytest.raises(UserError, match="drop Normalize"):
        accel_train.train(Net, normalised, output_dir=str(tmp_path / "n"), **OPTIONS)
    with pytest.raises(UserError, match="model must be a model name"):
        accel_train.train(42, data)
