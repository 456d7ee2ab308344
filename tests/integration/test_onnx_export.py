"""``convert_checkpoint.py MODEL --onnx FILE`` (``accel_train/onnx_export.py``): the model built by convert's rules,
exported with a dynamic batch axis, checked under onnxruntime against torch, and FILE.json saying how to prepare
inputs the way the training loop does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import assert_one_line_error
from conftest import REPO, check, fit_small, run_here

from accel_train.checkpoint.weights import export_weights, load_model
from accel_train.data.pipeline import BatchNormalizer
from accel_train.models import create_model

ATOL = 1e-4  # the command's default for fp32


def _session(path: Path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _assert_matches_torch(onnx_file: Path, weights: Path, batches: tuple[int, ...]) -> float:
    """onnxruntime on ``onnx_file`` vs the model rebuilt from ``weights``, on fresh batches of other sizes than the
    command checked: the batch axis is symbolic and every batch agrees within ATOL. Returns the largest difference."""
    session = _session(onnx_file)
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert isinstance(inp.shape[0], str) and inp.shape[0] == out.shape[0], (inp.shape, out.shape)  # dynamic
    model, config = load_model(weights)
    worst = 0.0
    for batch in batches:
        x = torch.randn(batch, config["in_channels"], config["image_size"], config["image_size"])
        (got,) = session.run([out.name], {inp.name: x.numpy()})
        with torch.no_grad():
            expected = model(x).numpy()
        assert got.shape == expected.shape == (batch, config["num_classes"])
        worst = max(worst, float(np.abs(got - expected).max()))
    assert worst <= ATOL, worst
    return worst


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory) -> Path:
    """A small real training run (lenet on synthetic images): RUN/model is its export."""
    pytest.importorskip("onnxscript")
    run = tmp_path_factory.mktemp("onnx") / "run"
    fit_small(run, "--epochs", "1")
    return run


@pytest.fixture(scope="module")
def lenet_onnx(lenet_run) -> tuple[Path, dict]:
    """``--onnx run/lenet.onnx --json`` on the run's export: (the file, the JSON report)."""
    target = lenet_run.parent / "lenet.onnx"
    proc = check(run_here("convert_checkpoint.py", str(lenet_run / "model"), "--onnx", str(target), "--json"))
    return target, json.loads(proc.stdout)["onnx"]


def test_a_runs_export_matches_torch_under_onnxruntime_with_a_dynamic_batch(lenet_run, lenet_onnx):
    target, report = lenet_onnx
    assert report["file"] == str(target) and target.is_file()
    assert report["exporter"] == "torch.onnx.export(dynamo=True)"
    assert 0 <= report["max_abs_diff"] <= report["atol"] == ATOL
    assert report["checked_batches"] == [4, 3] and report["input"]["shape"][0] == "batch"
    print("lenet: command", report["max_abs_diff"], "test", _assert_matches_torch(target, lenet_run / "model", (5, 1)))


def test_the_preprocessing_json_says_how_the_loop_normalises(lenet_run, lenet_onnx):
    """FILE.json (and the same inside the file) has the export's mean, std, sizes and classes; following its recipe
    on uint8 images gives what the model gives on the loop's ``BatchNormalizer`` batch."""
    target, report = lenet_onnx
    side = json.loads(Path(report["preprocessing"]).read_text())
    assert report["preprocessing"] == f"{target}.json"
    config = json.loads((lenet_run / "model" / "config.json").read_text())
    channels, size = config["in_channels"], config["image_size"]
    assert side["input"] == {"name": "input", "shape": ["batch", channels, size, size], "dtype": "float32",
                             "layout": "NCHW"}  # fmt: skip
    assert (side["channels"], side["image_size"], side["class_names"]) == (channels, size, config["class_names"])
    assert side["mean"] == config["mean"] and side["std"] == config["std"] and side["max_abs_diff"] <= ATOL
    assert "pixel / 255 - mean[c]) / std[c]" in side["normalize"] and "255" in side["pixel_scale"]
    session = _session(target)
    inside = json.loads(session.get_modelmeta().custom_metadata_map["accel_train.preprocessing"])
    assert {k: side[k] for k in inside} == inside

    gen = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (6, channels, size, size), dtype=torch.uint8, generator=gen)
    mean = np.array(side["mean"], dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.array(side["std"], dtype=np.float32).reshape(1, -1, 1, 1)
    recipe = ((pixels.numpy() / 255.0 - mean) / std).astype(np.float32)  # what the JSON says, in numpy
    (got,) = session.run(["logits"], {"input": recipe})
    model, _ = load_model(lenet_run / "model")
    with torch.no_grad():
        expected = model(BatchNormalizer(config["mean"], config["std"])(pixels)).numpy()  # the training loop's
    assert np.abs(got - expected).max() <= ATOL


def test_a_torchvision_model_exports_and_the_text_report_names_the_difference(tmp_path):
    pytest.importorskip("onnxscript")
    model = create_model("tv:resnet18", num_classes=4, in_channels=3, image_size=32)
    config = {"model": "tv:resnet18", "num_classes": 4, "in_channels": 3, "image_size": 32,
              "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "class_names": ["a", "b", "c", "d"]}  # fmt: skip
    export_weights(model, tmp_path / "model", config)
    target = tmp_path / "resnet.onnx"
    proc = check(run_here("convert_checkpoint.py", str(tmp_path / "model"), "--onnx", str(target)))
    found = re.search(r"largest absolute difference (\S+) on batches of 4 and 3 \(--onnx-atol 0.0001\)", proc.stdout)
    assert found and float(found.group(1)) <= ATOL, proc.stdout
    assert f"wrote {target}: tv:resnet18, input 'input' float32 [batch, 3, 32, 32]" in proc.stdout
    print("tv:resnet18: command", found.group(1), "test", _assert_matches_torch(target, tmp_path / "model", (2, 6)))


def _export(tmp_path: Path, model: str = "lenet") -> Path:
    config = {"model": model, "num_classes": 10, "in_channels": 1, "image_size": 28}
    export_weights(create_model("lenet").state_dict(), tmp_path / "model", config)
    return tmp_path / "model"


def test_a_missing_onnxruntime_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed: import raises ModuleNotFoundError
    proc = run_here("convert_checkpoint.py", str(_export(tmp_path)), "--onnx", str(tmp_path / "m.onnx"))
    assert_one_line_error(proc, "needs onnxruntime", "pip install 'accel_train[onnx]'", "onnx onnxscript onnxruntime")
    assert not list(tmp_path.glob("m.onnx*"))


def test_a_model_from_a_training_scripts_main_is_refused_with_how_to_export_it(tmp_path):
    source = _export(tmp_path, "__main__:Net")
    proc = run_here("convert_checkpoint.py", str(source), "--onnx", str(tmp_path / "m.onnx"))
    assert_one_line_error(proc, "__main__:Net", "defined in the script that trained it", "load_weights(model",
                          "torch.onnx.export(model.eval(), (torch.randn(2, 1, 28, 28),)")  # fmt: skip
    assert not list(tmp_path.glob("m.onnx*"))


def test_a_difference_over_the_tolerance_fails_and_writes_nothing(tmp_path, monkeypatch):
    pytest.importorskip("onnxscript")
    import accel_train.onnx_export as onnx_export

    monkeypatch.setattr(onnx_export, "_largest_difference", lambda *args: 0.5)
    proc = run_here("convert_checkpoint.py", str(_export(tmp_path)), "--onnx", str(tmp_path / "m.onnx"))
    assert_one_line_error(proc, "differs from torch by up to 0.5", "--onnx-atol 0.0001", "nothing was written")
    assert not list(tmp_path.glob("m.onnx*"))
    proc = run_here("convert_checkpoint.py", str(tmp_path / "model"), "--onnx", str(tmp_path / "m.onnx"),
                    "--onnx-atol", "0")  # fmt: skip
    assert_one_line_error(proc, "--onnx-atol must be a positive number")


class _Shifted(torch.nn.Module):
    """The model plus a constant: what the ONNX file computes in the test below, where torch computes the model."""

    def __init__(self, inner: torch.nn.Module, by: float):
        super().__init__()
        self.inner, self.by = inner, by

    def forward(self, x):
        return self.inner(x) + self.by


@pytest.mark.parametrize("by", [-1.0, 1.0])
def test_a_file_off_by_a_constant_either_way_fails_the_check(monkeypatch, by):
    """A real ONNX file whose outputs are torch's shifted by -1 (or +1), run under onnxruntime: 1 over the
    tolerance whatever its sign (a check of signed differences would pass the file that is 1 too low)."""
    pytest.importorskip("onnxscript")
    import accel_train.onnx_export as onnx_export
    from accel_train.errors import UserError

    trace = onnx_export._trace
    monkeypatch.setattr(onnx_export, "_trace", lambda model, x, name: trace(_Shifted(model, by).eval(), x, name))
    config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28}
    with pytest.raises(UserError, match="differs from torch by up to 1 under onnxruntime, over --onnx-atol 0.0001"):
        onnx_export.export_onnx(create_model("lenet"), config, atol=ATOL)


def test_nan_outputs_fail_the_check():
    """A model that gives NaN is no match, whatever the tolerance (NaN is never <= atol); NaN weights are named as
    such before any export, not blamed on the tolerance."""
    pytest.importorskip("onnxscript")
    from accel_train.errors import UserError
    from accel_train.onnx_export import export_onnx

    class NanOut(torch.nn.Module):  # finite weights, NaN outputs
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(28 * 28, 10)

        def forward(self, x):
            return self.fc(x.flatten(1)) * 0.0 * float("inf")

    config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28}
    with pytest.raises(UserError, match="differs from torch by up to nan"):
        export_onnx(NanOut(), config, atol=1.0)
    model = create_model("lenet")
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(UserError, match=r"weights hold NaN or Inf values \(net.0.weight\).*before the run diverged"):
        export_onnx(model, config, atol=1.0)


def test_help_and_the_package_never_import_onnx():
    code = (
        "import sys, accel_train, accel_train.commands.convert as c; c.build_parser().format_help(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxscript', 'onnxruntime', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_dev_requirements_install_the_onnx_extra():
    """requirements-dev.txt (what CI installs) names the extra's packages with the same ranges as pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["onnx"]
    dev = [line.split("#")[0].strip() for line in (REPO / "requirements-dev.txt").read_text().splitlines()]
    assert set(extra) <= set(dev), (extra, dev)
