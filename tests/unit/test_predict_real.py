"""Issue 14, item 5, and issue 27, item 1: predictions on real images, prepared as the training images were, plus
only the steps an image provably needs.

A LeNet trained briefly on scikit-learn's digits classifies the held-out test digits drawn two ways:
"hand-drawn" (black ink on white paper, at another size, somewhere on a 96x64 page) and "MNIST-style"
(white on black, the digit's box scaled into 20x20 of 28x28, centred by centre of mass). ``predict``
must do as well on the first as on the second; ``--raw`` (the training pipeline only) shows why. The test digits
as they are (28x28, as the dataset holds them) get nothing added, and ``predict`` scores them as ``eval`` does.


The in-process tests; whole runs and launches are in ../integration/test_predict_real_runs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_predict_real import held_out_digits, mnist_style
from PIL import Image

from accel_train.errors import CheckpointError
from accel_train.preprocess import INK, KNOWN, check_preprocess, describe_training_images, prepare_image


def _pil(tensor: torch.Tensor) -> Image.Image:
    """Float [C, H, W] in [0, 1] -> a PIL image (L or RGB)."""
    array = (tensor * 255).round().clamp(0, 255).to(torch.uint8)
    return (
        Image.fromarray(array[0].numpy(), "L")
        if array.shape[0] == 1
        else Image.fromarray(array.permute(1, 2, 0).numpy())
    )


def test_prepared_inputs_do_not_depend_on_polarity_size_or_place():
    pixels, _ = held_out_digits()
    record = KNOWN["mnist"]
    base = torch.from_numpy(np.asarray(mnist_style(pixels[0]), dtype=np.float32) / 255)[None]
    page = torch.ones(1, 64, 96)  # the same digit, black on white, twice the size, right of centre
    page[:, 4:60, 34:90] = 1 - torch.nn.functional.interpolate(base[None], size=(56, 56), mode="bilinear")[0]
    a, b = prepare_image(_pil(base), 1, 28, record), prepare_image(_pil(page), 1, 28, record)
    assert a.pixels.shape == b.pixels.shape == (1, 28, 28) and a.pixels.dtype == torch.uint8
    assert [s["step"] for s in b.steps] == ["invert", "frame"] and not any(s["as_trained"] for s in b.steps)
    assert torch.corrcoef(torch.stack([a.pixels.flatten().float(), b.pixels.flatten().float()]))[0, 1] > 0.8


def test_inverted_only_where_every_training_image_had_the_other_polarity():
    """A large dark shape on a white page is not inverted for a model of white pages (its most common colour is
    dark, which fooled the old check); a dark page is, but only when every training page was white."""
    big = torch.ones(3, 20, 20)
    big[:, 2:18, 2:18] = 0.1  # 64% of the image is the dark shape; the page (border) stays white
    night = torch.full((3, 20, 20), 0.05)
    night[:, 6:14, 6:14] = 0.9
    white_pages = {"fit": "stretch", "background": 0.99, "border": [0.93, 1.0]}
    steps = lambda image, record: [s["step"] for s in prepare_image(_pil(image), 3, 16, record).steps]  # noqa: E731
    assert steps(big, white_pages) == ["resize"]
    assert steps(night, white_pages) == ["resize", "invert"]
    assert steps(night, {**white_pages, "border": [0.2, 1.0]}) == ["resize"]  # some training page was dark
    assert steps(night, {"fit": "stretch", "background": 0.99}) == ["resize"]  # an export without the border
    assert prepare_image(_pil(night), 3, 16, white_pages, adapt=False).steps[-1]["step"] == "resize"  # --raw


def test_pad_fit_keeps_the_aspect_and_pads_with_the_border_colour():
    image = torch.full((3, 20, 40), 0.2)
    image[:, 5:15, 10:30] = 0.9
    out = prepare_image(_pil(image), 3, 16, {"fit": "pad", "background": 0.45})  # mid-grey training data
    assert [(s["step"], s["as_trained"]) for s in out.steps] == [("pad", False), ("resize", True)]
    pixels = out.pixels.float() / 255
    assert out.pixels.shape == (3, 16, 16)
    assert torch.allclose(pixels[:, :3], torch.full((3, 3, 16), 0.2), atol=0.01)
    assert torch.allclose(pixels[:, 13:], pixels[:, :3], atol=0.01)
    assert pixels[:, 8, 8].min() > 0.8  # the bright middle, not squeezed away
    square = prepare_image(_pil(image[:, :, :20]), 3, 16, {"fit": "pad"})
    assert [s["step"] for s in square.steps] == ["resize"]  # a square image is only resized, as in training


def test_recorded_statistics_of_digits_and_of_mnist_style_data():
    from accel_train.data.base import TensorImageDataset

    pixels, labels = held_out_digits()
    mnist = torch.stack([torch.from_numpy(np.array(mnist_style(p))) for p in pixels])[:, None]
    record = describe_training_images(TensorImageDataset(mnist, torch.as_tensor(labels)), "mnist")
    assert record["fit"] == "digit" and record["centre"] == "mass" and record["background"] < 0.05
    assert abs(record["box"] - 20 / 28) < 0.05 and record["border"] == [0.0, 0.0]
    assert record["box_range"][0] <= record["box"] <= record["box_range"][1] and record["offset"] < 0.1
    digits = torch.nn.functional.interpolate(torch.from_numpy(pixels)[:, None].float(), size=(28, 28), mode="bilinear")
    record = describe_training_images(TensorImageDataset(digits.round().to(torch.uint8), torch.as_tensor(labels)), "x")
    assert record["fit"] == "pad" and "box" not in record


def test_exports_without_a_record_and_bad_records(tmp_path):
    assert check_preprocess({"dataset": "mnist"}, "c") == KNOWN["mnist"]  # exports of earlier versions
    assert check_preprocess({"dataset": "cifar10"}, "c") == {"fit": "stretch"}  # resize only, as before
    old_digits = {"dataset": "digits", "preprocess": {"fit": "digit", "background": 0.0, "box": 1.0}}
    assert check_preprocess(old_digits, "c")["border"] == [0.0, 0.0]  # a digit record from before the border
    assert "border" not in check_preprocess({"dataset": "imagefolder:x", "preprocess": {"fit": "stretch"}}, "c")
    with pytest.raises(CheckpointError, match=r"preprocess\.border must be \[low, high\]"):
        check_preprocess({"preprocess": {"fit": "pad", "border": [0.9, 0.1]}}, "c")
    with pytest.raises(CheckpointError, match=r"c: preprocess\.fit must be one of pad, stretch, digit"):
        check_preprocess({"preprocess": {"fit": "zoom"}}, "c")
    with pytest.raises(CheckpointError, match=r"preprocess\.background must be a number between 0 and 1"):
        check_preprocess({"preprocess": {"fit": "pad", "background": 3}}, "c")


def _framing_by_hand(image: list[list[float]], background: float, by_mass: bool):
    """One digit's (box side, centre offset), pixel by pixel in Python: the oracle for the batched version."""
    diff = [[abs(v - background) for v in row] for row in image]
    peak = max(max(max(row) for row in diff), 1e-6)
    ink = [(r, c) for r, row in enumerate(diff) for c, v in enumerate(row) if v > INK * peak]
    if not ink:
        return None
    top, bottom = min(r for r, _ in ink), max(r for r, _ in ink)
    left, right = min(c for _, c in ink), max(c for _, c in ink)
    side, middle = len(image), (len(image) - 1) / 2
    if by_mass:
        mass = max(sum(map(sum, diff)), 1e-6)
        cy = sum(r * v for r, row in enumerate(diff) for v in row) / mass
        cx = sum(c * v for row in diff for c, v in enumerate(row)) / mass
    else:
        cy, cx = (top + bottom) / 2, (left + right) / 2
    return (max(bottom - top, right - left) + 1) / side, max(abs(cy - middle), abs(cx - middle)) / side


@pytest.mark.parametrize("by_mass", [True, False])
def test_the_batched_framing_of_each_digit_is_the_one_measured_alone(by_mass):
    """``describe_training_images`` frames its sample in one batched pass; each image's figures are the ones a
    pixel-by-pixel loop gets, with blank images (None) and ink on the very edges among them."""
    from accel_train.preprocess import _framings

    g = torch.Generator().manual_seed(0)
    images = torch.rand(40, 10, 10, generator=g) * (torch.rand(40, 10, 10, generator=g) > 0.85)
    images[3], images[4] = 0.0, 0.3  # blank, and one flat grey field (no pixel stands out)
    images[5, 0, 0] = images[5, 9, 9] = 1.0  # ink in two opposite corners
    for background in (0.0, 0.3):
        batched = _framings(images, background, by_mass)
        alone = [_framing_by_hand(image.tolist(), background, by_mass) for image in images]
        assert [f is None for f in batched] == [f is None for f in alone]
        assert sum(f is None for f in alone) >= 1 and sum(f is not None for f in alone) >= 30
        for got, want in zip(batched, alone, strict=True):
            if want is not None:
                assert got == pytest.approx(want, abs=1e-6)
