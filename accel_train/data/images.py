"""Opening image files safely: regular files only, a pixel limit, and every failure as one line naming the file.

``open_image`` is the one way an image file is opened (``accel-predict``, the image-folder scan).
``check_image_files`` reads every image of a folder once before training (header + ``verify()``) and
reports the unreadable ones by name with a count, instead of a traceback from the middle of an epoch.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from accel_train.errors import UserError
from accel_train.limits import check_regular_file

MAX_IMAGE_PIXELS = 1 << 26  # 67 megapixels (8192 x 8192): larger is refused as a possible decompression bomb
GRAY = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
ALPHA = frozenset({"LA", "RGBA", "PA", "La", "RGBa"})
# what PIL raises for damaged image data (its own errors subclass these)
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, ZeroDivisionError)


def _too_large(path: Any, what: str) -> UserError:
    return UserError(
        f"image {path} is too large: {what}, more than the limit of {MAX_IMAGE_PIXELS:,} pixels "
        "(a decompression bomb?); resize it first"
    )


def open_image(path: str | os.PathLike):
    """``PIL.Image.open`` (header only) of a regular file within :data:`MAX_IMAGE_PIXELS`; one-line UserErrors."""
    from PIL import Image, UnidentifiedImageError

    check_regular_file(path, "image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        raise _too_large(path, f"{int(pixels.group(1)):,} pixels" if pixels else "its header says so") from None
    except UnidentifiedImageError:
        raise UserError(f"cannot read image {path}: not an image file (unknown or damaged format)") from None
    except DECODE_ERRORS as exc:
        raise UserError(f"cannot read image {path}: {' '.join(str(exc).split())[:200]}") from None
    if image.width * image.height > MAX_IMAGE_PIXELS:
        image.close()
        raise _too_large(path, f"{image.width}x{image.height} pixels")
    return image


def _problem(path: Path, verify: bool = True) -> tuple[str | None, tuple[int, int] | None, str | None]:
    """(mode, (height, width), None) for a readable image, (None, None, why) for one that is not. ``verify``: read
    the whole file (truncated or corrupt data, bad checksums), else the header only."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return None, None, "not a regular file (a FIFO, a device or a socket)"
        if st.st_size == 0:
            return None, None, "empty (0 bytes)"
        with open_image(path) as image:
            mode, size = image.mode, (image.height, image.width)
            if verify:
                image.verify()
        return mode, size, None
    except UserError as exc:
        return None, None, str(exc).removeprefix(f"cannot read image {path}: ")
    except (*DECODE_ERRORS, MemoryError) as exc:
        return None, None, " ".join(str(exc).split())[:120] or type(exc).__name__


def refuse_loop(parent: str, name: str, real_parent: str | None = None) -> None:
    """A one-line UserError if the folder ``parent/name`` is a link back to a folder that contains it (walking
    it with links followed would never end)."""
    real = real_parent or os.path.realpath(parent)
    target = os.path.realpath(os.path.join(parent, name))
    if real == target or real.startswith(target + os.sep):
        raise UserError(
            f"{os.path.join(parent, name)} links back to {target}, a folder that contains it (a directory loop); "
            "remove the link"
        )


def image_files(directory: Path, extensions: Iterable[str]) -> Iterator[Path]:
    """Non-hidden files under ``directory`` with one of ``extensions``; a directory loop is refused."""
    extensions = frozenset(extensions)
    for parent, dirnames, filenames in os.walk(directory, followlinks=True):
        real = os.path.realpath(parent)
        for name in dirnames:
            refuse_loop(parent, name, real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in extensions:
                yield Path(parent) / name


def check_image_files(directories: Iterable[Path], extensions: Iterable[str], where: Path) -> Counter:
    """Open every image under ``directories`` once; unreadable ones are one UserError with names and a count.

    Returns how many images there are of each PIL mode (``L``, ``RGB``, ``RGBA``, ...).
    """
    paths = [path for directory in directories for path in image_files(directory, extensions)]
    return check_images(paths, where)[0]


def check_images(paths: Iterable[Path], where: Path, verify: bool = True) -> tuple[Counter, Counter]:
    """Open each image once (``verify``: read it whole); the unreadable ones are one UserError naming them with a
    count. Returns how many images there are of each PIL mode, and of each (height, width) size."""
    modes: Counter = Counter()
    sizes: Counter = Counter()
    bad: list[str] = []
    total = 0
    for path in paths:
        total += 1
        mode, size, why = _problem(path, verify)
        if why is None:
            modes[mode] += 1
            sizes[size] += 1
        else:
            bad.append(f"{path.relative_to(where) if path.is_relative_to(where) else path} ({why})")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise UserError(f"{where}: {len(bad)} of {total} image files cannot be read: {shown}; remove or replace them")
    return modes, sizes


def mixed_modes_note(where: Path, modes: Counter, channels: int) -> list[str]:
    """One line saying how images of several modes are converted (none when they share one)."""
    if len(modes) <= 1:
        return []
    counts = ", ".join(f"{mode}: {n}" for mode, n in sorted(modes.items()))
    target = "RGB (3 channels)" if channels == 3 else "grayscale (1 channel, ITU-R 601-2 luma)"
    alpha = "; alpha channels are dropped" if any(mode in ALPHA for mode in modes) else ""
    return [f"{where} mixes image modes ({counts}): every image is converted to {target}{alpha}"]


def channels_for(modes: Counter) -> int:
    """3 if any image has colour, else 1: nothing is lost by converting grayscale to RGB."""
    return 1 if modes and all(mode in GRAY for mode in modes) else 3
