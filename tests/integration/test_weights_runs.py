"""Weights in every shape the seeds and other tools write them: read, load, export, inspect, scripts.

Whole runs and launches; the in-process tests are in ../unit/test_weights.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_here
from helpers_weights import compiled_pt, dataparallel_pkl, seeded_model
from PIL import Image

from accel_train.checkpoint.weights import (
    inspect_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=_script_env()
    )


def _script_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the scripts must find the package on their own
    return env


def _write_pngs(d: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i, mode in enumerate(("L", "RGB")):
        shape = (40, 40) if mode == "L" else (20, 20, 3)
        image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode)
        paths.append(d / f"img{i}.png")
        image.save(paths[-1])
    return paths


def test_scripts_end_to_end(tmp_path):
    original = seeded_model()
    source = dataparallel_pkl(original, tmp_path)

    inspected = _run_script("scripts/convert_checkpoint.py", str(source))
    assert inspected.returncode == 0, inspected.stderr
    assert "module." in inspected.stdout and "net.0.weight" in inspected.stdout

    out = tmp_path / "clean"
    flags = ["--model", "lenet", "--num-classes", "10", "--in-channels", "1", "--image-size", "28"]
    converted = run_here("convert_checkpoint.py", str(source), "--out", str(out), *flags)  # the main, in this process
    assert converted.returncode == 0, converted.stderr
    assert (out / "model.safetensors").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config == {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28}
    info = inspect_checkpoint(out)
    assert info["prefixes"] == [] and info["format"] == "safetensors"

    config.update(mean=[0.5], std=[0.25], class_names=[f"c{i}" for i in range(10)])
    (out / "config.json").write_text(json.dumps(config))
    images = _write_pngs(tmp_path)
    predicted = _run_script("scripts/predict.py", "--weights", str(out), *map(str, images), "--top-k", "3")
    assert predicted.returncode == 0, predicted.stderr
    lines = predicted.stdout.strip().splitlines()
    assert len(lines) == 2
    for line, image in zip(lines, images, strict=True):
        assert line.startswith(f"{image}: ")
        fields = line.split(": ", 1)[1].split()
        names, probs = fields[0::2], [float(p) for p in fields[1::2]]
        assert len(names) == 3 and all(n in config["class_names"] for n in names)
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001

    # the same numbers in process: L, resize, [0, 1], (x - mean) / std
    with Image.open(images[1]) as im:
        pixels = np.asarray(im.convert("L").resize((28, 28), Image.Resampling.BILINEAR), dtype=np.float32) / 255
    x = (torch.from_numpy(pixels)[None, None] - 0.5) / 0.25
    with torch.no_grad():
        expected = torch.softmax(original(x), dim=1)[0]
    as_json = run_here("predict.py", "--weights", str(out), *map(str, images), "--json", "--top-k", "20")
    assert as_json.returncode == 0, as_json.stderr
    results = json.loads(as_json.stdout)
    assert [r["image"] for r in results] == [str(p) for p in images]
    top = results[1]["top_k"]
    assert len(top) == 10 and top[0]["index"] == int(expected.argmax())
    assert top[0]["class"] == f"c{int(expected.argmax())}"
    assert top[0]["prob"] == pytest.approx(float(expected.max()), abs=1e-5)


def test_convert_without_model_and_json_inspection(tmp_path):
    source = compiled_pt(seeded_model(), tmp_path)
    converted = run_here("convert_checkpoint.py", str(source), "--out", str(tmp_path / "c"))
    assert converted.returncode == 0, converted.stderr
    assert "--model" in converted.stdout
    assert (tmp_path / "c" / "model.safetensors").is_file() and not (tmp_path / "c" / "config.json").exists()
    inspected = run_here("convert_checkpoint.py", str(tmp_path / "c"), "--json")
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert info["format"] == "safetensors" and info["num_tensors"] == len(seeded_model().state_dict())

    mismatch = run_here(
        "convert_checkpoint.py",
        str(source),
        "--out",
        str(tmp_path / "d"),
        "--model",
        "lenet",
        "--num-classes",
        "3",
    )
    assert mismatch.returncode == 2 and "num_classes" in mismatch.stderr
    assert not (tmp_path / "d" / "model.safetensors").exists()


def test_scripts_report_errors_on_one_line(tmp_path):
    image = _write_pngs(tmp_path)[0]
    for args in (
        ["scripts/predict.py", "--weights", str(tmp_path / "missing"), str(image)],
        ["scripts/convert_checkpoint.py", str(tmp_path / "missing.pkl")],
    ):
        result = _run_script(*args)
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr and "does not exist" in result.stderr
    debug = _run_script("scripts/convert_checkpoint.py", str(tmp_path / "missing.pkl"), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr
