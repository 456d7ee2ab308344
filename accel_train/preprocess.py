"""The preprocessing a model was trained with, recorded at export and applied to real images by ``accel-predict``.

At export, :func:`describe_training_images` writes ``config.json["preprocess"]`` from a sample of the
training images:

* ``background``: the most common intensity in [0, 1] (most pixels of a digit or a drawing are background);
  it fixes the colour polarity the model knows (MNIST: light ink on a dark background);
* ``fit``: how an image of any shape becomes ``image_size`` x ``image_size``: ``pad`` (aspect kept, padded
  with the image's own border colour), ``stretch`` (resized to a square, as image-folder and Hub datasets
  are at training time) or ``digit`` (MNIST-style centring, for ``digits`` and ``mnist``);
* ``digit`` only: ``box``, the side of the digit's bounding box as a fraction of the image side
  (MNIST: 20/28; scikit-learn's digits fill the height: 1.0). The digit is scaled, aspect kept, so its
  longer side fills that box, then placed with its centre of mass at the centre, as MNIST was made.

:func:`prepare_image` then gives an input of another polarity, size or framing the look of the training
data: a photo of black ink on white paper is inverted for a model trained on MNIST.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from accel_train.errors import CheckpointError

DIGIT_DATASETS = ("digits", "mnist")
STRETCHED = ("imagefolder:", "hf:")  # datasets whose builders resize every image to a square
FITS = ("pad", "stretch", "digit")
STATS_SAMPLE = 1024  # training images read for the statistics (held in memory)
STATS_SAMPLE_DECODED = 256  # ... decoded one by one (image folders, your own datasets)
INK = 0.3  # a pixel is ink when it differs from the background by this fraction of the image's largest difference
# Exports written before the preprocessing was recorded: what their datasets are known to look like.
KNOWN = {
    "mnist": {"background": 0.0, "fit": "digit", "box": round(20 / 28, 4), "centre": "mass"},
    "digits": {"background": 0.0, "fit": "digit", "box": 1.0, "centre": "box"},
}
RAW = {"fit": "stretch"}  # resize only: what accel-predict did before (--raw)
WORK_SIDE = 1024  # larger images are first shrunk to this longer side


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


def _bbox(ink: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right), inclusive, of the True pixels of a [H, W] mask; None when there are none."""
    rows, cols = ink.any(1).nonzero().flatten(), ink.any(0).nonzero().flatten()
    if len(rows) == 0:
        return None
    return int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])


def _ink(gray: torch.Tensor, background: float) -> torch.Tensor:
    """Where a [H, W] image differs from its background by more than INK of its largest difference."""
    diff = (gray - background).abs()
    return diff > INK * diff.max().clamp_min(1e-6)


def _centre_of_mass(weights: torch.Tensor) -> tuple[float, float]:
    mass = weights.sum().clamp_min(1e-6)
    rows, cols = torch.arange(weights.shape[0]), torch.arange(weights.shape[1])
    return float((weights.sum(1) * rows).sum() / mass), float((weights.sum(0) * cols).sum() / mass)


def _digit_framing(gray: torch.Tensor, background: float) -> dict[str, Any]:
    """How the training digits sit in their field: box side (fraction), centred by box or by centre of mass."""
    side, middle = gray.shape[-1], (gray.shape[-1] - 1) / 2
    sides, off_box, off_mass = [], 0.0, 0.0
    for image in gray:
        box = _bbox(_ink(image, background))
        if box is None:
            continue
        top, bottom, left, right = box
        sides.append(max(bottom - top, right - left) + 1)
        cy, cx = _centre_of_mass((image - background).abs())
        off_box += abs((top + bottom) / 2 - middle) + abs((left + right) / 2 - middle)
        off_mass += abs(cy - middle) + abs(cx - middle)
    found = float(torch.tensor(sides, dtype=torch.float32).median()) if sides else side
    return {"box": round(found / side, 4), "centre": "mass" if off_mass <= off_box else "box"}


def describe_training_images(dataset: Any, dataset_name: str) -> dict[str, Any]:
    """``config.json["preprocess"]`` for a model trained on ``dataset`` (samples are uint8 [C, H, W])."""
    fit = "digit" if dataset_name in DIGIT_DATASETS else "stretch" if dataset_name.startswith(STRETCHED) else "pad"
    if len(dataset) == 0:
        return {"fit": fit}
    gray = _sample(dataset)
    background = _background(gray)
    record: dict[str, Any] = {"background": round(background, 4), "fit": fit}
    if fit == "digit":
        record.update(_digit_framing(gray, background))
    return record


def check_preprocess(config: dict, where: str) -> dict[str, Any]:
    """The recorded preprocessing (or what a known dataset needs, or resize only), every field checked."""
    record = config.get("preprocess")
    if record is None:
        return dict(KNOWN.get(str(config.get("dataset")), RAW))

    def fail(field: str, problem: str) -> None:
        raise CheckpointError(f"{where}: preprocess.{field} {problem}; fix the file or re-export the model")

    if not isinstance(record, dict):
        fail("", f"must be a JSON object, got {record!r:.60}")
    if record.get("fit") not in FITS:
        fail("fit", f"must be one of {', '.join(FITS)}, got {record.get('fit')!r:.60}")
    if record.get("centre", "mass") not in ("mass", "box"):
        fail("centre", f"must be 'mass' or 'box', got {record.get('centre')!r:.60}")
    for key, low in (("background", 0.0), ("box", 1e-3)):
        value = record.get(key)
        if value is not None and not (isinstance(value, (int, float)) and low <= value <= 1):
            fail(key, f"must be a number between {low:g} and 1, got {value!r:.60}")
    return record


def _resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[C, H, W] float resized with antialiasing (a large drawing shrinks without aliasing)."""
    if tuple(image.shape[-2:]) == (height, width):
        return image
    out = F.interpolate(image[None], size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return out[0].clamp(0, 1)


def _fit_aspect(image: torch.Tensor, size: int, fill: torch.Tensor) -> torch.Tensor:
    """Longer side to ``size``, aspect kept, centred on a ``fill``-coloured square."""
    _, h, w = image.shape
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    canvas = fill.view(-1, 1, 1).expand(image.shape[0], size, size).clone()
    top, left = (size - nh) // 2, (size - nw) // 2
    canvas[:, top : top + nh, left : left + nw] = _resize(image, nh, nw)
    return canvas


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


def prepare_image(image: torch.Tensor, size: int, record: dict[str, Any]) -> torch.Tensor:
    """A float [C, H, W] image in [0, 1] of any size -> [C, size, size] as the training images looked."""
    h, w = image.shape[-2:]
    if max(h, w) > WORK_SIDE:  # a photo: every step below is cheaper, and quantile has a size limit
        image = _resize(image, max(1, round(h * WORK_SIDE / max(h, w))), max(1, round(w * WORK_SIDE / max(h, w))))
    gray = image.mean(0)
    own_background = _background(gray)
    background = record.get("background")
    if background is not None and abs(background - 0.5) > 0.25 and (own_background < 0.5) != (background < 0.5):
        image, gray, own_background = 1 - image, 1 - gray, 1 - own_background  # the polarity the model knows
    fit = record["fit"]
    if fit == "stretch":
        return _resize(image, size, size)
    if fit == "pad":
        border = torch.cat([image[:, 0], image[:, -1], image[:, :, 0], image[:, :, -1]], dim=1)
        return _fit_aspect(image, size, border.median(1).values)
    # digit: ink strength from 0 (background) to 1 (the darkest/lightest stroke), then MNIST-style framing
    ink = (gray - own_background).abs()
    ink = (ink / ink.quantile(0.99).clamp_min(ink.max() * 0.5).clamp_min(1e-6)).clamp(0, 1)
    digit = _centre_digit(ink, size, float(record.get("box", 20 / 28)), record.get("centre", "mass") == "mass")
    light = background is not None and background >= 0.5
    digit = 1 - digit if light else digit
    return digit.expand(image.shape[0], size, size).clone()
