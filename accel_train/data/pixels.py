"""Image arrays and PIL images as uint8 ``[C, H, W]`` / ``[N, C, H, W]`` tensors of a given size and channel count:
every layout and dtype the datasets bring ([H, W], [H, W, C], [C, H, W]; uint8, bool, floats in [0, 1] or [0, 255]),
alpha dropped, gray by ITU-R 601-2 luma. Shared by image folders, Hub datasets, the Python API and predict."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from accel_train.errors import UserError

GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


def _array_to_nchw(arr: np.ndarray, batched: bool) -> np.ndarray:
    """An image array ([H,W], [H,W,C] or [C,H,W]; with a leading N when ``batched``) as [N, C, H, W]."""
    if not batched:
        arr = arr[None]
    if arr.ndim == 3:
        return arr[:, None]
    if arr.ndim == 4:
        first, last = arr.shape[1], arr.shape[3]
        if last in (1, 2, 3, 4) and first not in (1, 2, 3, 4):
            return arr.transpose(0, 3, 1, 2)
        if first in (1, 2, 3, 4):
            return arr
        if last in (1, 2, 3, 4):
            return arr.transpose(0, 3, 1, 2)
    shape = tuple(arr.shape[1:])
    raise UserError(f"unsupported image array shape {shape}: expected [H, W], [H, W, C] or [C, H, W] with C in 1..4")


WIDE_GRAY_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})  # more than 8 bits per pixel


def _to_uint8(arr: np.ndarray, what: str = "an image array") -> np.ndarray:
    """Pixel values as uint8 without loss of range: bool as 0/255; unsigned 16-bit (and integers up to 65535) scaled
    by 255/65535, integers within 0..255 kept; floats in [0, 1] scaled by 255, floats within 0..255 kept. Anything
    else (negative values, NaN, larger numbers) is refused in one line instead of clipped."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if not arr.size:
        return arr.astype(np.uint8)
    low, high = float(np.min(arr)), float(np.max(arr))
    if np.issubdtype(arr.dtype, np.floating):
        if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high > 255:
            raise UserError(
                f"{what} holds floats from {low:g} to {high:g}: only [0, 1] or [0, 255] pixel values are read; "
                "convert the images to 8 or 16 bits"
            )
        return (arr * 255.0 if high <= 1.0 else arr).round().astype(np.uint8)
    if low < 0 or high > 65535:
        raise UserError(
            f"{what} holds integers from {low:g} to {high:g}: only 0..255 or 0..65535 (16-bit) pixel values are read; "
            "convert the images to 8 or 16 bits"
        )
    if arr.dtype == np.uint16 or high > 255:  # 16-bit: 65535 is white
        return ((arr.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    return arr.astype(np.uint8)


def _match_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """[N, C, H, W] uint8 with C in 1..4 -> [N, channels, H, W] (drops alpha; ITU-R 601-2 luma for gray)."""
    c = x.shape[1]
    if c == 2:  # gray + alpha
        x, c = x[:, :1], 1
    elif c == 4:  # RGBA
        x, c = x[:, :3], 3
    if c == channels:
        return x
    if channels == 3:
        return x.expand(-1, 3, -1, -1)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    return (x.float() * weights).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)


def images_to_nchw(arr: Any, channels: int, size: int, batched: bool = True) -> torch.Tensor:
    """Image array(s) of any common layout/dtype -> uint8 [N, channels, size, size] (one batched resize)."""
    from accel_train.data.vision import resize_uint8

    x = torch.from_numpy(np.ascontiguousarray(_array_to_nchw(_to_uint8(np.asarray(arr)), batched)))
    return resize_uint8(_match_channels(x, channels), size).contiguous()


def to_8bit(image: Any, where: Any = "an image") -> Any:
    """A PIL image with more than 8 bits per pixel (16-bit ``I;16``, 32-bit ``I``, float ``F``) as ``L``, scaled as
    :func:`_to_uint8` scales (PIL's own ``convert("L")`` clips 16-bit values at 255: most of a 16-bit image white);
    other modes unchanged (their ``convert`` is faithful)."""
    if image.mode not in WIDE_GRAY_MODES:
        return image
    from PIL import Image

    return Image.fromarray(_to_uint8(np.asarray(image), f"{where} (mode {image.mode})"), mode="L")


def to_mode_and_size(image: Any, channels: int, size: int, where: Any = "an image") -> Any:
    """A PIL image as gray (``channels`` 1) or RGB, ``size`` x ``size`` (bilinear; PIL antialiases when shrinking),
    16-bit and float images scaled to 8 bits first (:func:`to_8bit`)."""
    from PIL import Image

    image = to_8bit(image, where)
    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return image


def image_to_chw(image: Any, channels: int, size: int) -> torch.Tensor:
    """One PIL image or array -> uint8 [channels, size, size]."""
    from PIL import Image

    if isinstance(image, Image.Image):
        arr = np.asarray(to_mode_and_size(image, channels, size))
        return torch.from_numpy(np.array(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1), order="C"))
    return images_to_nchw(image, channels, size, batched=False)[0]


def infer_channels(image: Any) -> int:
    """1 for grayscale images (PIL gray modes, 2-D or 1-/2-channel arrays), else 3."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return 1 if image.mode in GRAY_MODES else 3
    return 1 if _array_to_nchw(np.asarray(image), batched=False).shape[1] <= 2 else 3


def image_size_of(image: Any) -> tuple[int, int]:
    """(height, width) of a PIL image, an array, or an undecoded datasets image dict (header read only)."""
    from PIL import Image

    if isinstance(image, dict):  # datasets.Image(decode=False): {"bytes": ..., "path": ...}
        if image.get("bytes"):
            with Image.open(io.BytesIO(image["bytes"])) as im:
                return im.height, im.width
        with Image.open(image["path"]) as im:
            return im.height, im.width
    if isinstance(image, Image.Image):
        return image.height, image.width
    shape = _array_to_nchw(np.asarray(image), batched=False).shape
    return shape[2], shape[3]
