"""Generate an image folder at the scale users bring: ``DIR/train/<class>/*.png`` and ``DIR/test/<class>/*.png``.

python -m benchmarks.folder_gen DIR --train 100000 --test 10000 [--size 32] [--classes 10] [--workers 2]

Each image is a small PNG whose colour and stripe depend on its class (so a model can learn the task), with
per-image noise (so no two files are the same). The same arguments write the same files. Written by ``--workers``
processes, each a contiguous range of files; an existing file of the right name is kept (a cut-short generation
resumes).
"""

from __future__ import annotations

import argparse
import os
import sys
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


def _write_range(args: tuple[str, str, int, int, int, int, int]) -> int:
    from PIL import Image

    root, split, start, stop, per_class_total, size, classes = args
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
        jobs += [(str(root), split, s, min(s + chunk, n), n // classes, size, classes) for s in range(0, n, chunk)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_write_range, jobs))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.folder_gen", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    seconds = generate(args.root, args.train, args.test, args.size, args.classes, args.workers)
    print(f"{args.root}: {args.train} train + {args.test} test images in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
