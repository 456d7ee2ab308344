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


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating):
        if arr.size and float(np.nanmax(arr)) <= 1.0:  # [0, 1] floats
            arr = arr * 255.0
        return np.nan_to_num(arr).round().clip(0, 255).astype(np.uint8)
    return arr.clip(0, 255).astype(np.uint8)


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


def to_mode_and_size(image: Any, channels: int, size: int) -> Any:
    """A PIL image as gray (``channels`` 1) or RGB, ``size`` x ``size`` (bilinear; PIL antialiases when shrinking)."""
    from PIL import Image

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
