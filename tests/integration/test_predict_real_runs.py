"""Issue 14, item 5, and issue 27, item 1: predictions on real images, prepared as the training images were, plus
only the steps an image provably needs.

A LeNet trained briefly on scikit-learn's digits classifies the held-out test digits drawn two ways:
"hand-drawn" (black ink on white paper, at another size, somewhere on a 96x64 page) and "MNIST-style"
(white on black, the digit's box scaled into 20x20 of 28x28, centred by centre of mass). ``predict``
must do as well on the first as on the second; ``--raw`` (the training pipeline only) shows why. The test digits
as they are (28x28, as the dataset holds them) get nothing added, and ``predict`` scores them as ``eval`` does.


Whole runs and launches; the in-process tests are in ../unit/test_predict_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers_predict_real import N_DIGITS, held_out_digits, mnist_style
from PIL import Image

PAGE = (96, 64)  # width, height of a hand-drawn page


def hand_drawn(pixels: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """Black ink on white, 36..59 pixels tall, anywhere on a 96x64 page."""
    side = int(rng.integers(36, 60))
    digit = Image.fromarray(255 - pixels, mode="L").resize((side, side), Image.Resampling.BICUBIC)
    page = Image.new("L", PAGE, 255)
    page.paste(digit, (int(rng.integers(0, PAGE[0] - side)), int(rng.integers(0, PAGE[1] - side))))
    return page


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory) -> Path:
    """LeNet on digits, 3 epochs in process: its export records the training images' preprocessing."""
    from accel_train.config import parse_config
    from accel_train.loop import fit

    out = tmp_path_factory.mktemp("digits") / "run"
    flags = ["--dataset", "digits", "--model", "lenet", "--epochs", "3", "--output-dir", str(out)]
    fit(parse_config([*flags, "--report-to", "none", "--no-plots", "--no-progress"]))
    return out / "model"


@pytest.fixture(scope="module")
def drawings(tmp_path_factory) -> dict[str, Path]:
    """The same test digits, hand-drawn and MNIST-style, one PNG each, the label in the file name."""
    root = tmp_path_factory.mktemp("drawings")
    rng = np.random.default_rng(0)
    folders = {"hand": root / "hand", "mnist": root / "mnist"}
    for folder in folders.values():
        folder.mkdir()
    for i, (pixels, label) in enumerate(zip(*held_out_digits(), strict=True)):
        hand_drawn(pixels, rng).save(folders["hand"] / f"{i:03d}_{label}.png")
        mnist_style(pixels).save(folders["mnist"] / f"{i:03d}_{label}.png")
    return folders


def _predict(capsys, weights: Path, folder: Path, *flags: str) -> list[dict]:
    from accel_train.commands.predict import main

    capsys.readouterr()
    assert main(["--weights", str(weights), str(folder), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _accuracy(capsys, weights: Path, folder: Path, *flags: str, added: list[str]) -> float:
    """Top-1 accuracy; every image got exactly the steps ``added`` beyond the training pipeline."""
    results = _predict(capsys, weights, folder, *flags)
    assert len(results) == N_DIGITS
    for result in results:
        assert [s["step"] for s in result["preprocess"] if not s["as_trained"]] == added, result["preprocess"]
    hits = [r["top_k"][0]["class"] == Path(r["image"]).stem.split("_")[1] for r in results]
    return sum(hits) / len(hits)


def test_hand_drawn_digits_are_classified_as_well_as_mnist_style_ones(
    digits_model, drawings, capsys, tmp_path, record_property
):
    record = json.loads((digits_model / "config.json").read_text())["preprocess"]
    assert record["fit"] == "digit" and record["background"] < 0.1 and record["border"][1] < 0.25
    sheet = tmp_path / "sheet.png"
    hand = _accuracy(capsys, digits_model, drawings["hand"], "--sheet", str(sheet), added=["invert", "frame"])
    mnist = _accuracy(capsys, digits_model, drawings["mnist"], added=["frame"])  # box 20/28, not the digits' 1.0
    raw = _accuracy(capsys, digits_model, drawings["hand"], "--raw", added=[])
    figures = {"hand_drawn": hand, "mnist_style": mnist, "hand_drawn_raw": raw}
    record_property("predict_accuracy", figures)
    print(f"predict accuracy on {N_DIGITS} test digits: {figures}")
    assert hand >= 0.85 and hand >= mnist - 0.05, figures
    assert raw < hand - 0.3, figures  # fed as they are, black-on-white pages are mostly misread
    assert sheet.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_digits_as_the_dataset_holds_them_get_nothing_added_and_predict_scores_them_as_eval(
    digits_model, capsys, tmp_path
):
    """The digits test split written as 28x28 PNGs: the training pipeline only, and eval's answers exactly."""
    from accel_train.data.digits import build_digits
    from accel_train.data.settings import DataConfig
    from accel_train.saved_eval import run_evaluation

    test = build_digits(DataConfig(dataset="digits")).test
    for i, (image, label) in enumerate(zip(test.images, test.labels.tolist(), strict=True)):
        Image.fromarray(image[0].numpy(), mode="L").save(tmp_path / f"{i:03d}_{label}.png")
    results = _predict(capsys, digits_model, tmp_path, "--top-k", "10")
    assert all([s["step"] for s in r["preprocess"]] == ["normalize"] for r in results)
    report = run_evaluation(str(digits_model))
    assert report["samples"] == len(results) == len(test)
    confusion = [[0] * 10 for _ in range(10)]
    nll = 0.0
    for result in results:
        truth = int(Path(result["image"]).stem.split("_")[1])
        confusion[truth][result["top_k"][0]["index"]] += 1
        nll -= float(np.log(next(c["prob"] for c in result["top_k"] if c["index"] == truth)))
    assert confusion == report["confusion_matrix"]
    assert nll / len(results) == pytest.approx(report["loss"], abs=1e-6)
