"""A small folder of drawn shapes, as a new user's first folder looks: ``DIR/{train,test}/<shape>/*.{png,jpg}``.

python -m benchmarks.shapes DIR [--classes 3] [--per-class 40] [--test-per-class 10] [--size 64] [--seed 0]

Each image is one shape (circle, square, triangle, cross, star: the first ``classes`` of them) in a random colour,
size and position on a random background colour, with mild pixel noise; every other image is a JPEG, the rest PNGs.
The class is the shape alone: nothing else (colour, position, size, format) says which it is, so a model that
learns it has learnt shapes wherever they are, and one that memorises the training images does not carry over.
The same arguments write the same files (``seed`` keys every image; the test images use other keys).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--test-per-class", type=int, default=10)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_shapes_folder(args.root, args.classes, args.per_class, args.test_per_class, args.size, args.seed)
    print(f"wrote {args.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
