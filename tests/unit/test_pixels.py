"""accel_train/data/pixels.py: every image mode read without loss of range (16-bit scaled, not clipped at 255),
or refused in one line; the same reading in training (image folders, hub datasets) and in accel-predict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from checks import raises_user_error
from PIL import Image

from accel_train.data import DataConfig, build_dataset
from accel_train.data.pixels import _to_uint8, image_to_chw, to_8bit
from accel_train.preprocess import prepare_image

RAMP16 = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 257).astype(np.uint16)  # 0 .. 65535 in steps
EXPECTED = (np.arange(16 * 16).reshape(16, 16)).astype(np.uint8)  # 8-bit: v * 257 * 255 / 65535 = v


def _save16(path, array=RAMP16):
    Image.fromarray(array).save(path)
    assert Image.open(path).mode == "I;16"
    return path


def test_a_16_bit_png_is_scaled_not_clipped(tmp_path):
    image = Image.open(_save16(tmp_path / "ramp.png"))
    assert np.array_equal(np.asarray(to_8bit(image)), EXPECTED)
    gray = image_to_chw(image, 1, 16)
    assert torch.equal(gray[0], torch.from_numpy(EXPECTED))  # PIL's convert("L") would give 255 from 256 on
    rgb = image_to_chw(image, 3, 16)
    assert torch.equal(rgb[1], torch.from_numpy(EXPECTED))


def test_a_folder_of_16_bit_images_trains_and_predicts_on_the_same_pixels(tmp_path):
    for c, scale in (("dark", 1), ("light", 3)):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(5):
            _save16(tmp_path / "imgs" / c / f"{i}.png", (RAMP16 // 4 * scale).astype(np.uint16))
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{tmp_path / 'imgs'}"))
    assert splits.info.in_channels == 1
    seen = torch.stack([splits.train[i][0] for i in range(len(splits.train))])
    assert int(seen.max()) > 180 and len(seen.unique()) > 100  # clipped, most pixels would read 255
    record = {"fit": "stretch"}
    with Image.open(tmp_path / "imgs" / "light" / "0.png") as image:
        predicted = prepare_image(image, 1, 16, record, adapt=False).pixels
    assert torch.equal(predicted[0], torch.from_numpy(np.array(to_8bit(Image.open(tmp_path / "imgs/light/0.png")))))


def test_a_dark_16_bit_png_keeps_the_16_bit_scale(tmp_path):
    """A 16-bit image is read on its own scale, 65535 white, however dark: values 0..300 of 65535 are 0..1 of 255,
    not 0..255 as if 8-bit (nor clipped at 255 as PIL's convert("L") does), and the same image 200 times as bright
    reads 200 times as bright. Read from real files with the functions training and accel-predict decode them by."""
    dark = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 300 // 255).astype(np.uint16)  # 0 .. 300
    for name, array in (("dark", dark), ("darker", dark // 2), ("bright", dark * 200)):  # darker: 0 .. 150
        expected = ((array.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)  # v * 255 / 65535, rounded
        with Image.open(_save16(tmp_path / f"{name}.png", array)) as image:
            assert np.array_equal(np.asarray(to_8bit(image)), expected), name
            assert torch.equal(image_to_chw(image, 1, 16)[0], torch.from_numpy(expected)), name
            assert torch.equal(image_to_chw(image, 3, 16)[2], torch.from_numpy(expected)), name
        assert int(expected.max()) == {"dark": 1, "darker": 1, "bright": 233}[name]  # dark stays dark


def test_float_and_32_bit_images_are_read_by_their_range_or_refused():
    unit = Image.fromarray(np.linspace(0, 1, 256, dtype=np.float32).reshape(16, 16), mode="F")
    assert np.asarray(to_8bit(unit)).max() == 255 and np.asarray(to_8bit(unit)).min() == 0
    wide = Image.fromarray((np.arange(256, dtype=np.int32) * 1000).reshape(16, 16), mode="I")
    raises_user_error(lambda: to_8bit(wide, "x.tif"), "x.tif (mode I)", "0..65535", "convert the images")
    small = Image.fromarray(np.arange(256, dtype=np.int32).reshape(16, 16), mode="I")
    assert np.array_equal(np.asarray(to_8bit(small)), np.arange(256).reshape(16, 16))


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.array([0, 257, 65535], dtype=np.uint16), [0, 1, 255]),
        (np.array([0.0, 0.5, 1.0], dtype=np.float32), [0, 128, 255]),
        (np.array([0.0, 100.0, 255.0]), [0, 100, 255]),
        (np.array([0, 100, 255], dtype=np.int64), [0, 100, 255]),
        (np.array([0, 1000, 65535], dtype=np.int32), [0, 4, 255]),
    ],
)
def test_arrays_are_scaled_by_their_range(array, expected):
    assert _to_uint8(array).tolist() == expected


@pytest.mark.parametrize(
    "array", [np.array([0.0, 300.0]), np.array([-1.0, 0.5]), np.array([np.nan, 0.5]), np.array([0, 70000])]
)
def test_arrays_out_of_any_pixel_range_are_refused(array):
    raises_user_error(lambda: _to_uint8(array, "column 'image'"), "column 'image'", "convert the images to 8 or 16")
