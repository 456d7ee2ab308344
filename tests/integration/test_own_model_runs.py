"""Issue 14, items 1 and 2: any torchvision model, your own model code, and the Python API ``accel_train.train``.

Whole runs and launches; the in-process tests are in ../unit/test_own_model.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO, check, fit_small, launch_cmd, summary
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from accel_train.checkpoint.weights import load_model, load_weights
from accel_train.doctor.launching import child_env
from accel_train.errors import UserError
from accel_train.models import create_model

TINY = ["--max-steps", "3", "--checkpoint-epochs", "--no-plots"]


# A user's package: building the model imports it, and importing it leaves a mark next to it.
USER_MODULE = """
    from pathlib import Path

    import torch.nn as nn

    (Path(__file__).parent / "IMPORTED").write_text("imported")


    def build(num_classes, in_channels, image_size):
        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch) -> Path:
    """``mypkg.mymodel:build`` importable from ``tmp_path``; removed from ``sys.modules`` afterwards."""
    package = tmp_path / "code" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mymodel.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(package.parent))
    yield package
    for name in ("mypkg", "mypkg.mymodel"):
        sys.modules.pop(name, None)


def _forget(package: Path) -> None:
    """As in a fresh process: the module not imported, no mark."""
    for name in ("mypkg", "mypkg.mymodel"):
        sys.modules.pop(name, None)
    (package / "IMPORTED").unlink(missing_ok=True)


def test_torchvision_model_trains_exports_and_rebuilds(tmp_path):
    out = tmp_path / "run"
    fit_small(out, "--model", "tv:mobilenet_v3_small", *TINY)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model"] == "tv:mobilenet_v3_small"
    assert (config["in_channels"], config["image_size"], config["num_classes"]) == (1, 16, 10)
    model, loaded = load_model(out / "model")  # torchvision code is not user code: no opt-in needed
    assert type(model).__name__ == "MobileNetV3" and loaded["model"] == "tv:mobilenet_v3_small"
    assert model.features[0][0].in_channels == 1 and model(torch.zeros(2, 1, 16, 16)).shape == (2, 10)


def test_torchvision_model_run_stops_and_resumes_exactly(tmp_path):
    """Resume reads the checkpoint's config through the same name check as --model (tv: names included)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ("--model", "tv:mobilenet_v3_small", *TINY, "--max-steps", "4")
    fit_small(straight, *args)
    fit_small(resumed, *args, "--stop-at-step", "2")
    assert fit_small(resumed, *args, "--resume", "auto")["global_step"] == 4
    a = load_file(str(straight / "model" / "model.safetensors"))
    b = load_file(str(resumed / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_user_model_trains_and_rebuilds_only_with_opt_in(tmp_path, user_package):
    out = tmp_path / "run"
    fit_small(out, "--model", "mypkg.mymodel:build", *TINY)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model"] == "mypkg.mymodel:build"

    _forget(user_package)
    with pytest.raises(UserError, match=r"names your code mypkg\.mymodel:build.*--allow-import"):
        load_model(out / "model")
    assert "mypkg.mymodel" not in sys.modules and not (user_package / "IMPORTED").exists()

    model, _ = load_model(out / "model", allow_import=True)
    assert (user_package / "IMPORTED").exists() and model(torch.zeros(1, 1, 16, 16)).shape == (1, 10)
    _forget(user_package)
    load_model(out / "model", model_name="mypkg.mymodel:build")  # naming it is an explicit choice too
    assert (user_package / "IMPORTED").exists()


def test_a_config_alone_never_imports_code(tmp_path, user_package, capsys):
    """config.json naming a module: load_model, predict, evaluate, convert and inspect all leave it unimported.

    Convert copies the tensors and config without building the model; the others refuse without --allow-import."""
    from PIL import Image

    from accel_train.checkpoint.weights import export_weights, inspect_checkpoint, user_code_allowed
    from accel_train.commands import convert, evaluate, predict

    export = tmp_path / "export"
    sizes = {"num_classes": 10, "in_channels": 1, "image_size": 16}
    export_weights(create_model("lenet", **sizes), export, {"model": "mypkg.mymodel:build", **sizes})
    image = tmp_path / "x.png"
    Image.new("L", (16, 16)).save(image)
    _forget(user_package)

    attempts = {
        "load_model": lambda: load_model(export),
        "predict": lambda: predict.main(["--weights", str(export), str(image)]),
        "evaluate": lambda: evaluate.main(["--weights", str(export), "--dataset", "synthetic"]),
    }
    for name, attempt in attempts.items():
        with pytest.raises(UserError, match="--allow-import"):
            attempt()
        assert "mypkg.mymodel" not in sys.modules and not (user_package / "IMPORTED").exists(), name
    assert convert.main([str(export), "--out", str(tmp_path / "converted")]) == 0
    assert "imported only with --allow-import" in capsys.readouterr().out
    assert "mypkg.mymodel" not in sys.modules and not (user_package / "IMPORTED").exists()
    assert json.loads((tmp_path / "converted" / "config.json").read_text())["model"] == "mypkg.mymodel:build"
    with pytest.raises(UserError, match="do not fit"):  # --allow-import: imported, built, the lenet weights refused
        convert.main([str(export), "--out", str(tmp_path / "checked"), "--allow-import"])
    assert (user_package / "IMPORTED").exists() and not (tmp_path / "checked").exists()
    _forget(user_package)
    assert inspect_checkpoint(export)["model_config"]["model"] == "mypkg.mymodel:build"
    with user_code_allowed(False):
        with pytest.raises(UserError, match="--allow-import"):
            load_model(export)
    assert not (user_package / "IMPORTED").exists()
    with user_code_allowed():  # what accel-evaluate --allow-import does around the evaluation
        with pytest.raises(UserError, match="do not fit"):  # imported, built, and the lenet weights refused
            load_model(export)
    assert (user_package / "IMPORTED").exists()


def test_example_script_under_accelerate_launch_multi_cpu(tmp_path):
    """examples/train_your_model.py as a user runs it: two gloo ranks from multi_cpu.yaml, one run."""
    cmd = launch_cmd(str(REPO / "examples" / "train_your_model.py"), config="multi_cpu.yaml")
    proc = subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    check(proc)
    out = tmp_path / "runs" / "your_model"
    s = summary(out)
    assert s["world_size"] == 2 and s["distributed_type"] == "MULTI_CPU"
    assert s["eval_accuracy"] >= 0.85 and s["eval_samples"] == 397
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model"] == "__main__:TinyNet" and config["image_size"] == 8
    # examples/use_your_weights.py: the saved weights in the user's own TinyNet give the run's test accuracy
    use = [sys.executable, str(REPO / "examples" / "use_your_weights.py")]
    used = check(subprocess.run(use, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300))
    assert used.stdout.strip().endswith(f"({round(s['eval_accuracy'] * 397)}/397)"), used.stdout


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


class _TupleOut(Net):
    def forward(self, x):
        return self.net(x), x.mean()


class _Frozen(Net):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requires_grad_(False)


def test_api_models_that_cannot_train_are_one_line(tmp_path):
    """A model returning a tuple, fewer outputs than classes, or nothing to train: one line naming the fix, before
    any step (they ended in tracebacks from inside the loss or the optimizer)."""
    import accel_train

    data = TensorDataset(torch.rand(40, 1, 16, 16), torch.arange(40) % 4)
    cases = [
        (_TupleOut(4), "returned a tuple, not one tensor of class scores [batch, num_classes] = [16, 4]"),
        (Net(2), "returned shape (16, 2) for a batch of 16; it must return [batch, num_classes] = [16, 4]"),
        (_Frozen(4), "has no parameter to train"),
    ]
    for i, (model, needle) in enumerate(cases):
        with pytest.raises(UserError) as info:
            accel_train.train(model, data, output_dir=str(tmp_path / f"r{i}"), **OPTIONS)
        assert needle in str(info.value) and "\n" not in str(info.value)
        assert not (tmp_path / f"r{i}" / "summary.json").exists()
