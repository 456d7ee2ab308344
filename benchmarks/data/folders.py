"""The image folders the data benchmarks generate, each the same files for the same arguments.

* :func:`generate`: a folder at the scale users bring (``python -m benchmarks data-scale``; also the MNIST-shaped
  folder of ``busy-threads``): ``DIR/train/<class>/*.png`` and ``DIR/test/<class>/*.png``, each image a small PNG
  whose colour and stripe depend on its class (so a model can learn the task) with per-image noise (no two files
  the same), written by ``workers`` processes, each a contiguous range of files; an existing file of the right
  name is kept (a cut-short generation resumes).
* :func:`write_shapes_folder`: a small folder of drawn shapes, as a new user's first folder looks
  (``python -m benchmarks shapes``; the tests' own-folder data): ``DIR/{train,test}/<shape>/*.{png,jpg}``. Each
  image is one shape (circle, square, triangle, cross, star: the first ``classes`` of them) in a random colour,
  size and position on a random background colour, with mild pixel noise; every other image is a JPEG, the rest
  PNGs. The class is the shape alone: nothing else (colour, position, size, format) says which it is, so a model
  that learns it has learnt shapes wherever they are, and one that memorises the training images does not carry
  over. ``seed`` keys every image (the test images use other keys).
* :func:`write_photo_folder`: JPEGs of the PyTorch transfer-learning tutorial's shape (``python -m benchmarks
  photos`` without ``--folder``): two classes of random textures told apart by their colour balance.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def _image(size: int, label: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    hue = np.array([(label * 97) % 256, (label * 57 + 80) % 256, (label * 31 + 160) % 256], dtype=np.int16)
    img = rng.integers(-40, 40, size=(size, size, 3), dtype=np.int16) + hue
    band = (label * size) // classes
    img[band : band + max(1, size // classes), :, :] = 255
    return img.clip(0, 255).astype(np.uint8)


def _write_range(args: tuple[str, str, int, int, int, int]) -> int:
    from PIL import Image

    root, split, start, stop, size, classes = args
    written = 0
    for i in range(start, stop):
        label = i % classes
        path = Path(root) / split / f"class_{label:03d}" / f"{split}_{i:08d}.png"
        if path.exists():
            continue
        rng = np.random.default_rng((1 if split == "train" else 2) * 10_000_019 + i)
        Image.fromarray(_image(size, label, classes, rng)).save(path, compress_level=1)
        written += 1
    return written


def generate(root: Path, train: int, test: int, size: int = 32, classes: int = 10, workers: int = 2) -> float:
    """Write the folder; returns the seconds it took."""
    t0 = time.perf_counter()
    jobs = []
    for split, n in (("train", train), ("test", test)):
        for label in range(classes):
            (root / split / f"class_{label:03d}").mkdir(parents=True, exist_ok=True)
        chunk = max(1, -(-n // (workers * 8)))
        jobs += [(str(root), split, s, min(s + chunk, n), size, classes) for s in range(0, n, chunk)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_write_range, jobs))
    return time.perf_counter() - t0


SHAPES = ("circle", "square", "triangle", "cross", "star")
MIN_CONTRAST = 90  # least summed RGB distance between a shape and its background


def _colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A background and a shape colour at least :data:`MIN_CONTRAST` apart."""
    while True:
        back, fore = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        if np.abs(back - fore).sum() >= MIN_CONTRAST:
            return tuple(int(v) for v in back), tuple(int(v) for v in fore)


def _outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The polygon of ``shape`` (not the circle) of radius ``r`` around ``(cx, cy)``, upright."""
    if shape == "square":
        corners = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
        points = [(x * r * 0.85, y * r * 0.85) for x, y in corners]
    elif shape == "triangle":  # 1.3 r to its corners: about the area of the others, so size says nothing
        points = [
            (1.3 * r * math.cos(a), 1.3 * r * math.sin(a))
            for a in (-math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))
        ]
    elif shape == "cross":
        a, b = r, r * 0.35
        points = [(-b, -a), (b, -a), (b, -b), (a, -b), (a, b), (b, b), (b, a), (-b, a), (-b, b), (-a, b), (-a, -b)]
        points += [(-b, -b)]
    else:  # star: five points, inner radius 0.45
        points = [
            ((r if k % 2 == 0 else 0.45 * r) * math.cos(-math.pi / 2 + k * math.pi / 5),
             (r if k % 2 == 0 else 0.45 * r) * math.sin(-math.pi / 2 + k * math.pi / 5))
            for k in range(10)
        ]  # fmt: skip
    return [(cx + x, cy + y) for x, y in points]


def shape_image(shape: str, size: int, rng: np.random.Generator):
    """One ``size`` x ``size`` RGB PIL image of ``shape``: random colours, radius and position, mild noise."""
    from PIL import Image, ImageDraw

    back, fore = _colours(rng)
    image = Image.new("RGB", (size, size), back)
    r = float(rng.uniform(0.12, 0.28)) * size
    reach = 1.3 * r if shape == "triangle" else r  # inside the image, whole
    cx, cy = (float(v) for v in rng.uniform(reach + 1, size - reach - 1, 2))
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fore)
    else:
        draw.polygon(_outline(shape, cx, cy, r), fill=fore)
    noise = rng.integers(-12, 13, (size, size, 3))
    return Image.fromarray(np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8))


def write_shapes_folder(
    root: str | Path, classes: int = 3, per_class: int = 40, test_per_class: int = 10, size: int = 64, seed: int = 0
) -> Path:
    """Write ``root/train/<shape>/`` (``per_class`` images each) and ``root/test/<shape>/`` (``test_per_class``);
    every other image a JPEG (quality 90), the rest PNGs. Returns ``root``."""
    if not 2 <= classes <= len(SHAPES):
        raise ValueError(f"classes must be between 2 and {len(SHAPES)}, got {classes}")
    root = Path(root)
    for split, count, key in (("train", per_class, 1), ("test", test_per_class, 2)):
        for c, shape in enumerate(SHAPES[:classes]):
            folder = root / split / shape
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = shape_image(shape, size, np.random.default_rng([seed, key, c, i]))
                if i % 2:
                    image.save(folder / f"{shape}_{i:04d}.jpg", quality=90)
                else:
                    image.save(folder / f"{shape}_{i:04d}.png")
    return root


def write_photo_folder(root: Path, train: int = 245, val: int = 153, seed: int = 0) -> Path:
    """JPEGs of the tutorial's shape (two classes, sizes 300-500 pixels): textures, told apart by colour balance."""
    from PIL import Image

    for split, count in (("train", train), ("val", val)):
        for c, name in enumerate(("ants", "bees")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count // 2 + (c == 0) * (count % 2)):
                rng = np.random.default_rng([seed, len(split), c, i])
                h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
                small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.float32)
                small[..., c] *= 0.8
                image = Image.fromarray(small.astype(np.uint8)).resize((w, h), Image.BILINEAR)
                image.save(folder / f"{i}.jpg", quality=85)
    return root
