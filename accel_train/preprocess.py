"""How ``accel-predict`` prepares an image file: as the model's training images were, plus only the steps an
image provably needs. Recorded at export in ``config.json["preprocess"]`` by :func:`describe_training_images`.

The training pipeline, applied to every image (``as_trained`` steps):

* read as the dataset builders read files: EXIF orientation applied, converted to ``L`` or ``RGB``;
* resized to ``image_size`` x ``image_size`` with the resampler the training data went through: PIL bilinear for
  ``fit: stretch`` (image folders and Hub datasets, :func:`~accel_train.data.folder.image_to_chw`), torch's
  antialiased bilinear for in-memory datasets (:func:`~accel_train.data.vision.resize_uint8`);
* normalised with the config's ``mean``/``std`` (by the caller, as the loop does: ``BatchNormalizer``).

An image that already looks like the training images gets nothing else, so ``accel-predict`` and ``accel-evaluate``
give the same answers on the same files. Only what the record proves is added:

* ``invert``: when every sampled training image's border (the median of its outermost pixels) was near one end of
  the range (``border: [lo, hi]`` within 0.25 of black or of white) and this image's border is near the other end:
  no training image looked like it, and inverted it looks like all of them (a black-on-white drawing for MNIST).
  Exports written before ``border`` was recorded never invert, except for the digit datasets in :data:`KNOWN`;
* ``frame``, for ``fit: digit`` (``digits``, ``mnist``): the digit's bounding box scaled into ``box`` of the field
  and centred by its centre of mass (MNIST) or its box, as the training digits were made, unless the image is
  already ``image_size`` square with its ink box and centre inside what the training digits had (``box_range``,
  ``offset``, fractions of the side);
* ``pad``, for ``fit: pad`` (in-memory datasets of square images): a non-square image is centred on a square of its
  own border colour before the resize, instead of being squeezed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from accel_train.errors import CheckpointError

DIGIT_DATASETS = ("digits", "mnist")
STRETCHED = ("imagefolder:", "hf:", "shards:")  # datasets whose builders resize every image to a square with PIL
FITS = ("pad", "stretch", "digit")
STATS_SAMPLE = 1024  # training images read for the statistics (held in memory)
STATS_SAMPLE_DECODED = 256  # ... decoded one by one (image folders, your own datasets)
INK = 0.3  # a pixel is ink when it differs from the background by this fraction of the image's largest difference
EXTREME = 0.25  # a border within this of black (or of white) gives an image its polarity
TOLERANCE = 1e-4  # the record's numbers are rounded to 4 decimals
# Exports written before the preprocessing was recorded: what their datasets are known to look like.
KNOWN = {
    "mnist": {"background": 0.0, "fit": "digit", "box": round(20 / 28, 4), "centre": "mass", "border": [0.0, 0.0]},
    "digits": {"background": 0.0, "fit": "digit", "box": 1.0, "centre": "box", "border": [0.0, 0.0]},
}
RAW = {"fit": "stretch"}  # what an export without a record had: PIL resize, as image folders are read
WORK_SIDE = 1024  # framing a digit: larger images are first shrunk to this longer side
EXIF_ORIENTATION = 0x0112  # the EXIF tag; 1 is "as stored"


@dataclass
class Prepared:
    """One image ready for the normaliser: uint8 ``[C, size, size]`` and the steps that made it, in order.

    Each step is ``{"step": name, "detail": what exactly, "as_trained": whether the training images had it}``.
    """

    pixels: torch.Tensor
    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, step: str, detail: str, as_trained: bool) -> None:
        self.steps.append({"step": step, "detail": detail, "as_trained": as_trained})


# --------------------------------------------------------------------------- measuring images


def _sample(dataset: Any) -> torch.Tensor:
    """Up to STATS_SAMPLE training images, evenly spaced, unaugmented, as float [N, H, W] gray in [0, 1]."""
    images = getattr(dataset, "images", None)
    if isinstance(images, torch.Tensor) and images.dim() == 4:  # held in memory: one index op
        n = len(dataset)
        idx = torch.linspace(0, n - 1, min(n, STATS_SAMPLE)).round().long().unique()
        batch = images.index_select(0, idx.to(images.device)).cpu()  # the split may live on the training device
    else:
        from accel_train.data.folder import unaugmented_sample

        batch = unaugmented_sample(dataset, STATS_SAMPLE_DECODED)
    return batch.float().mean(1) / 255.0


def _background(gray: torch.Tensor) -> float:
    """The most common intensity (the centre of the fullest of 64 bins): paper, or the field behind a digit."""
    counts = torch.histc(gray.flatten().float(), bins=64, min=0.0, max=1.0)
    return (int(counts.argmax()) + 0.5) / 64


def border_level(gray: torch.Tensor) -> torch.Tensor:
    """The median of the outermost pixels of each [..., H, W] gray image: the page or field the image is on."""
    edges = torch.cat([gray[..., 0, :], gray[..., -1, :], gray[..., :, 0], gray[..., :, -1]], dim=-1)
    return edges.median(-1).values


def _bbox(ink: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right), inclusive, of the True pixels of a [H, W] mask; None when there are none."""
    rows, cols = ink.any(1).nonzero().flatten(), ink.any(0).nonzero().flatten()
    if len(rows) == 0:
        return None
    return int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])


def _centre_of_mass(weights: torch.Tensor) -> tuple[float, float]:
    mass = weights.sum().clamp_min(1e-6)
    rows, cols = torch.arange(weights.shape[0]), torch.arange(weights.shape[1])
    return float((weights.sum(1) * rows).sum() / mass), float((weights.sum(0) * cols).sum() / mass)


def _framings(gray: torch.Tensor, background: float, by_mass: bool) -> list[tuple[float, float] | None]:
    """:func:`_framing` of each square [N, S, S] digit, in one pass over the batch (no loop per image)."""
    diff = (gray - background).abs()
    ink = diff > INK * diff.flatten(1).max(1).values.clamp_min(1e-6)[:, None, None]
    rows_any, cols_any = ink.any(2), ink.any(1)
    side, middle = gray.shape[-1], (gray.shape[-1] - 1) / 2
    rows, cols = torch.arange(gray.shape[-2]), torch.arange(gray.shape[-1])
    top = torch.where(rows_any, rows, gray.shape[-2]).amin(1)
    bottom = torch.where(rows_any, rows, -1).amax(1)
    left = torch.where(cols_any, cols, side).amin(1)
    right = torch.where(cols_any, cols, -1).amax(1)
    sides = ((torch.maximum(bottom - top, right - left) + 1).double() / side).tolist()
    if by_mass:
        mass = diff.sum((1, 2)).clamp_min(1e-6)
        cy, cx = (diff.sum(2) * rows).sum(1) / mass, (diff.sum(1) * cols).sum(1) / mass
        cy, cx = cy.double(), cx.double()
    else:
        cy, cx = (top + bottom).double() / 2, (left + right).double() / 2
    offsets = (torch.maximum((cy - middle).abs(), (cx - middle).abs()) / side).tolist()
    return [(s, o) if found else None for s, o, found in zip(sides, offsets, rows_any.any(1).tolist(), strict=True)]


def _framing(image: torch.Tensor, background: float, by_mass: bool) -> tuple[float, float] | None:
    """(ink box side, centre offset) of a square [S, S] digit as fractions of S; None without ink."""
    return _framings(image[None], background, by_mass)[0]


def _digit_framing(gray: torch.Tensor, background: float) -> dict[str, Any]:
    """How the training digits sit in their field: centred by box or by centre of mass (whichever fits them
    better), the median box side and the range of sides and the largest centre offset seen (fractions)."""
    mass, boxed = _framings(gray, background, True), _framings(gray, background, False)
    by_mass = sum(f[1] for f in mass if f) <= sum(f[1] for f in boxed if f)
    found = [f for f in (mass if by_mass else boxed) if f]
    if not found:
        return {"box": 1.0, "centre": "mass" if by_mass else "box"}
    sides = torch.tensor([f[0] for f in found])
    return {
        "box": round(float(sides.median()), 4),
        "centre": "mass" if by_mass else "box",
        "box_range": [round(float(sides.min()), 4), round(float(sides.max()), 4)],
        "offset": round(max(f[1] for f in found), 4),
    }


def describe_training_images(dataset: Any, dataset_name: str) -> dict[str, Any]:
    """``config.json["preprocess"]`` for a model trained on ``dataset`` (samples are uint8 [C, H, W])."""
    fit = "digit" if dataset_name in DIGIT_DATASETS else "stretch" if dataset_name.startswith(STRETCHED) else "pad"
    if len(dataset) == 0:
        return {"fit": fit}
    gray = _sample(dataset)
    background = _background(gray)
    borders = border_level(gray)
    record: dict[str, Any] = {
        "background": round(background, 4),
        "fit": fit,
        "border": [round(float(borders.min()), 4), round(float(borders.max()), 4)],
    }
    if fit == "digit":
        record.update(_digit_framing(gray, background))
    return record


# --------------------------------------------------------------------------- reading the record


def _check_range(record: dict, key: str, fail) -> None:
    value = record.get(key)
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
    if value is not None and not (ok and 0 <= value[0] <= value[1] <= 1):
        fail(key, f"must be [low, high] with 0 <= low <= high <= 1, got {value!r:.60}")


def check_preprocess(config: dict, where: str) -> dict[str, Any]:
    """The recorded preprocessing (or what a known dataset needs, or resize only), every field checked.

    A digit dataset's record from before ``border`` was recorded gets the border the dataset is known to have.
    """
    record = config.get("preprocess")
    known = KNOWN.get(str(config.get("dataset")))
    if record is None:
        return dict(known or RAW)

    def fail(key: str, problem: str) -> None:
        raise CheckpointError(f"{where}: preprocess.{key} {problem}; fix the file or re-export the model")

    if not isinstance(record, dict):
        fail("", f"must be a JSON object, got {record!r:.60}")
    if record.get("fit") not in FITS:
        fail("fit", f"must be one of {', '.join(FITS)}, got {record.get('fit')!r:.60}")
    if record.get("centre", "mass") not in ("mass", "box"):
        fail("centre", f"must be 'mass' or 'box', got {record.get('centre')!r:.60}")
    for key, low in (("background", 0.0), ("box", 1e-3), ("offset", 0.0)):
        value = record.get(key)
        if value is not None and not (isinstance(value, (int, float)) and low <= value <= 1):
            fail(key, f"must be a number between {low:g} and 1, got {value!r:.60}")
    for key in ("border", "box_range"):
        _check_range(record, key, fail)
    if "border" not in record and known is not None:
        return {**record, "border": known["border"]}
    return record


def pipeline(record: dict[str, Any], channels: int, size: int) -> str:
    """The training pipeline in words (what every image gets), for the line ``accel-predict`` prints first."""
    resample = "PIL bilinear" if record["fit"] == "stretch" else "bilinear, antialiased"
    return f"read as {'L' if channels == 1 else 'RGB'}, resized to {size}x{size} ({resample}), normalised"


# --------------------------------------------------------------------------- preparing one image


def _resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[C, H, W] float resized with antialiasing (a large drawing shrinks without aliasing)."""
    if tuple(image.shape[-2:]) == (height, width):
        return image
    out = F.interpolate(image[None], size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return out[0].clamp(0, 1)


def _inversion(border: float, record: dict[str, Any]) -> str | None:
    """Why an image with this border is inverted, or None: only when it is at the other extreme from every
    training image's border."""
    seen = record.get("border")
    if not seen:
        return None
    low, high = seen
    if (high <= EXTREME and border >= 1 - EXTREME) or (low >= 1 - EXTREME and border <= EXTREME):
        return f"its border is {border:.2f}, every training image's was {low:.2f}-{high:.2f}"
    return None


def _framed_like_training(gray: torch.Tensor, record: dict[str, Any]) -> bool:
    """Whether a digit, resized as the training images were, already sits in its field as the training digits
    did: its ink box and centre inside what they had (then it is left alone)."""
    if "box_range" not in record or "offset" not in record:
        return False
    found = _framing(gray, float(record.get("background", 0.0)), record.get("centre", "mass") == "mass")
    if found is None:
        return True  # no ink: nothing to frame
    side, offset = found
    low, high = record["box_range"]
    return low - TOLERANCE <= side <= high + TOLERANCE and offset <= record["offset"] + TOLERANCE


def _centre_digit(ink: torch.Tensor, size: int, box: float, by_mass: bool) -> torch.Tensor:
    """[H, W] ink strength in [0, 1] -> [size, size]: bounding box scaled into ``box``, then centred by its
    centre of mass (MNIST) or by the box itself."""
    found = _bbox(ink > INK)
    if found is None:
        return torch.zeros(size, size)
    top, bottom, left, right = found
    crop = ink[top : bottom + 1, left : right + 1]
    target = max(1, round(box * size))
    scale = target / max(crop.shape)
    nh, nw = max(1, round(crop.shape[0] * scale)), max(1, round(crop.shape[1] * scale))
    digit = _resize(crop[None], nh, nw)[0]
    cy, cx = _centre_of_mass(digit) if by_mass else ((nh - 1) / 2, (nw - 1) / 2)
    top, left = round((size - 1) / 2 - cy), round((size - 1) / 2 - cx)
    big = torch.zeros(size + 2 * max(nh, nw), size + 2 * max(nh, nw))  # room to paste, then crop to the field
    pad = max(nh, nw)
    big[pad + top : pad + top + nh, pad + left : pad + left + nw] = digit
    return big[pad : pad + size, pad : pad + size]


def _frame_digit(gray: torch.Tensor, channels: int, size: int, record: dict[str, Any]) -> torch.Tensor:
    """A [H, W] gray digit in the training polarity -> uint8 [channels, size, size] framed as the training digits."""
    h, w = gray.shape
    if max(h, w) > WORK_SIDE:  # a photo: every step below is cheaper, and quantile has a size limit
        scale = WORK_SIDE / max(h, w)
        gray = _resize(gray[None], max(1, round(h * scale)), max(1, round(w * scale)))[0]
    ink = (gray - _background(gray)).abs()  # 0 (the page) to 1 (the darkest/lightest stroke)
    ink = (ink / ink.quantile(0.99).clamp_min(ink.max() * 0.5).clamp_min(1e-6)).clamp(0, 1)
    digit = _centre_digit(ink, size, float(record.get("box", 20 / 28)), record.get("centre", "mass") == "mass")
    if record.get("background", 0.0) >= 0.5:  # dark ink on a light field
        digit = 1 - digit
    return (digit * 255).round().to(torch.uint8).expand(channels, size, size).clone()


def _pad_square(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [C, H, W] centred on a square of its own border colour (the median of each channel's edge)."""
    c, h, w = pixels.shape
    side = max(h, w)
    fill = border_level(pixels.float()).round().to(torch.uint8)
    canvas = fill.view(c, 1, 1).expand(c, side, side).clone()
    top, left = (side - h) // 2, (side - w) // 2
    canvas[:, top : top + h, left : left + w] = pixels
    return canvas


def _read_as_trained(image: Any, channels: int, out: Prepared) -> Any:
    """The PIL image as the dataset builders read files: EXIF orientation applied (as ``datasets`` does), then
    converted to ``L`` or ``RGB``."""
    from PIL import ImageOps

    if image.getexif().get(EXIF_ORIENTATION) not in (None, 1):
        out.add("orient", "rotated/flipped as its EXIF orientation says", True)
        image = ImageOps.exif_transpose(image)
    from accel_train.data.pixels import to_8bit

    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:
        wide = to_8bit(image)
        out.add("convert", f"{image.mode} -> {mode}" + (" (scaled to 8 bits)" if wide is not image else ""), True)
        image = wide.convert(mode)
    return image


def prepare_image(image: Any, channels: int, size: int, record: dict[str, Any], adapt: bool = True) -> Prepared:
    """A PIL image of any size -> :class:`Prepared` (uint8 ``[channels, size, size]``), as the training images
    were read, plus the recorded steps this image provably needs (none with ``adapt=False``: ``--raw``).

    The polarity and the framing are judged on the image as the training pipeline makes it, the scale at which
    the training images were measured.
    """
    import numpy as np

    from accel_train.data.folder import image_to_chw
    from accel_train.data.vision import resize_uint8

    out = Prepared(torch.empty(0))
    image = _read_as_trained(image, channels, out)
    array = torch.from_numpy(np.array(image))
    pixels = array.unsqueeze(0) if array.dim() == 2 else array.permute(2, 0, 1).contiguous()
    fit, (h, w) = record["fit"], tuple(pixels.shape[-2:])
    # the training pipeline: PIL's resize for image folders and Hub datasets, torch's for in-memory data
    plain = image_to_chw(image, channels, size) if fit == "stretch" else resize_uint8(pixels[None], size)[0]
    why = _inversion(float(border_level(plain.float().mean(0) / 255)), record) if adapt else None
    inverted = {"step": "invert", "detail": why, "as_trained": False}
    if why:
        pixels, plain = 255 - pixels, 255 - plain
    if adapt and fit == "digit" and not _framed_like_training(plain.float().mean(0) / 255, record):
        centre = "centre of mass" if record.get("centre", "mass") == "mass" else "box"
        box = float(record.get("box", 20 / 28))
        out.steps += [inverted] if why else []
        out.add("frame", f"{w}x{h} -> {size}x{size}, the digit's box scaled to {box:.2f} of the side and centred by "
                f"its {centre}, as the training digits were", False)  # fmt: skip
        out.pixels = _frame_digit(pixels.float().mean(0) / 255, channels, size, record)
    elif adapt and fit == "pad" and h != w:
        out.steps += [inverted] if why else []
        out.add("pad", f"{w}x{h} -> {max(h, w)}x{max(h, w)}, centred on its own border colour", False)
        out.add("resize", f"{max(h, w)}x{max(h, w)} -> {size}x{size} (bilinear, antialiased)", True)
        out.pixels = resize_uint8(_pad_square(pixels)[None], size)[0]
    else:
        if (h, w) != (size, size):
            resample = "PIL bilinear" if fit == "stretch" else "bilinear, antialiased"
            out.add("resize", f"{w}x{h} -> {size}x{size} ({resample})", True)
        out.steps += [inverted] if why else []
        out.pixels = plain
    return out
