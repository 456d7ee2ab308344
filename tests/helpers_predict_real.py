"""Held-out digits drawn MNIST-style: shared by tests/unit/test_predict_real.py and
tests/integration/test_predict_real_runs.py."""

from __future__ import annotations

import numpy as np
from PIL import Image

N_DIGITS = 200  # of the digits test split (the model never saw them)


def held_out_digits() -> tuple[np.ndarray, np.ndarray]:
    """The first ``N_DIGITS`` images (uint8) and labels of the digits test split."""
    from accel_train.data.digits import load_digits_dataset

    test = load_digits_dataset()["test"]
    return np.asarray(test["image"], dtype=np.uint8)[:N_DIGITS], np.asarray(test["label"])[:N_DIGITS]


def mnist_style(pixels: np.ndarray) -> Image.Image:
    """White on black, 28x28: the digit's bounding box scaled into 20x20 (aspect kept), centre of mass centred."""
    ys, xs = np.nonzero(pixels > 0.3 * pixels.max())
    crop = pixels[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    scale = 20 / max(crop.shape)
    size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
    digit = np.asarray(Image.fromarray(crop, mode="L").resize(size, Image.Resampling.BILINEAR), dtype=np.float32)
    cy = (digit.sum(1) * np.arange(digit.shape[0])).sum() / digit.sum()
    cx = (digit.sum(0) * np.arange(digit.shape[1])).sum() / digit.sum()
    field = np.zeros((28 + 2 * 28, 28 + 2 * 28), np.float32)  # margins: paste anywhere, then cut the field
    top, left = 28 + round(13.5 - cy), 28 + round(13.5 - cx)
    field[top : top + digit.shape[0], left : left + digit.shape[1]] = digit
    return Image.fromarray(field[28:56, 28:56].clip(0, 255).astype(np.uint8), mode="L")
