"""Classify images with exported weights (``DIR/model.safetensors`` + ``DIR/config.json``).

Example::

    python scripts/predict.py --weights exported/ digit1.png my_drawings/ --top-k 3 --sheet sheet.png

Images are prepared as the model's training images were (``config.json["preprocess"]``, see
:mod:`accel_train.preprocess`): inverted when their colours are the other way round (black ink on
white for a model trained on MNIST), fitted to ``image_size`` keeping their aspect, and for digit
datasets framed as MNIST is (the digit scaled into its box, centred by centre of mass). Then they are
scaled to [0, 1] and normalised with the config's ``mean``/``std``; the model runs on CPU. Prints the
top-k classes (``class_names`` or indices) per image; ``--sheet`` draws them on a contact sheet.
"""

from __future__ import annotations

import argparse

from accel_train.cli import ArgumentParser, run_main  # light: no torch

BATCH = 256  # images per forward pass
MAX_SHEET = 100  # images drawn on a contact sheet


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description="Classify images with exported weights, on CPU.")
    parser.add_argument("--weights", required=True, help="export or checkpoint directory (or weights file)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or folders of them")
    parser.add_argument("--top-k", type=int, default=3, help="classes to print per image (default 3)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--sheet", metavar="PNG", help="also draw the images with their predictions into this PNG")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --sheet")
    parser.add_argument(
        "--raw", action="store_true", help="only resize the images (no polarity check, fit or digit centring)"
    )
    parser.add_argument(
        "--allow-import", action="store_true", help="let the weights' config import the user code it names as model"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def _per_channel(value, channels: int, name: str) -> list[float]:
    from accel_train.errors import UserError

    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) == 1:
        values *= channels
    if len(values) != channels:
        raise UserError(f"config {name} has {len(values)} values but the model has {channels} input channels")
    return values


def _expand(paths: list[str]) -> list[str]:
    """Files as given; folders replaced by the image files under them (sorted)."""
    from pathlib import Path

    from accel_train.data.folder import image_extensions
    from accel_train.data.images import image_files
    from accel_train.errors import UserError

    out: list[str] = []
    for path in paths:
        if Path(path).is_dir():
            found = [str(p) for p in image_files(Path(path), image_extensions())]
            if not found:
                raise UserError(f"folder {path} holds no image files; pass image files or a folder of them")
            out += found
        else:
            out.append(path)
    return out


def _read(path: str, mode: str):
    """The image at ``path`` as float [C, H, W] in [0, 1] (one-line UserErrors for what cannot be read)."""
    import numpy as np
    import torch

    from accel_train.data.images import DECODE_ERRORS, open_image
    from accel_train.errors import UserError

    with open_image(path) as image:
        try:
            array = np.asarray(image.convert(mode), dtype=np.float32) / 255.0
        except DECODE_ERRORS as exc:
            raise UserError(f"cannot read image {path}: {' '.join(str(exc).split())[:200]}") from None
    tensor = torch.from_numpy(array.copy())
    return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)


def _load_images(paths: list[str], config: dict, record: dict | None = None, originals: list | None = None):
    """Normalised model inputs [N, C, S, S] for ``paths``, prepared by ``record`` (default: the config's).

    ``originals``: a list that receives the images as read (for the contact sheet).
    """
    import torch

    from accel_train.errors import UserError
    from accel_train.preprocess import check_preprocess, prepare_image

    record = check_preprocess(config, "config.json") if record is None else record

    channels = int(config.get("in_channels", 1))
    if channels not in (1, 3):
        raise UserError(f"predict reads grayscale (1) or RGB (3) images; the model has in_channels={channels}")
    size = int(config.get("image_size", 28))
    mean = torch.tensor(_per_channel(config.get("mean", 0.0), channels, "mean")).view(-1, 1, 1)
    std = torch.tensor(_per_channel(config.get("std", 1.0), channels, "std")).view(-1, 1, 1)
    if bool((std == 0).any()):
        raise UserError("config std contains 0; fix config.json")
    batch = []
    for path in paths:
        image = _read(path, "L" if channels == 1 else "RGB")
        if originals is not None:
            originals.append(image)
        batch.append((prepare_image(image, size, record) - mean) / std)
    return torch.stack(batch)


def _predict(model, inputs, k: int):
    import torch

    with torch.no_grad():
        probs = torch.cat([torch.softmax(model(chunk).float(), dim=1) for chunk in inputs.split(BATCH)])
    return probs.topk(min(k, probs.shape[1]), dim=1)


def write_sheet(path: str, images: list, results: list[dict]) -> None:
    """A grid of the images, each titled with its top class and probability (at most MAX_SHEET)."""
    import math
    import os
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from accel_train.fsio import atomic_write, writing

    n = min(len(images), MAX_SHEET)
    cols = min(n, 8)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.9 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, result in zip(axes.flat, images, results[:n], strict=False):
        best = result["top_k"][0]
        shown = image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)
        ax.imshow(shown.numpy(), cmap="gray" if image.shape[0] == 1 else None, vmin=0, vmax=1)
        ax.set_title(f"{best['class']} ({best['prob']:.0%})", fontsize=9)
        ax.axis("on")  # a thin frame shows where a white page ends
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_color("0.8")
    if len(images) > n:
        fig.suptitle(f"the first {n} of {len(images)} images", fontsize=9)
    fig.tight_layout()
    real = Path(os.path.realpath(Path(path).expanduser()))  # where a link leads: the link itself stays
    try:
        with writing(real, "the contact sheet"):
            real.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(real, lambda tmp: fig.savefig(tmp, format="png", dpi=100), "the contact sheet")
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    import json

    from accel_train.checkpoint.weights import load_model
    from accel_train.errors import UserError
    from accel_train.preprocess import RAW, check_preprocess

    if args.top_k < 1:
        raise UserError("--top-k must be at least 1")
    if args.sheet:  # before the model and the images are loaded
        from accel_train.outputs import check_output_file, weights_inputs

        inputs = [*weights_inputs(args.weights), *args.images]
        check_output_file(args.sheet, "--sheet", suffixes=(".png",), overwrite=args.overwrite, inputs=inputs)
    paths = _expand(args.images)
    model, config = load_model(args.weights, allow_import=args.allow_import)
    record = RAW if args.raw else check_preprocess(config, f"{args.weights} (config.json)")
    originals: list = []
    inputs = _load_images(paths, config, record, originals if args.sheet else None)
    top_p, top_i = _predict(model, inputs, args.top_k)
    names = config.get("class_names")
    results = []
    for path, ps, idx in zip(paths, top_p.tolist(), top_i.tolist(), strict=True):
        classes = [
            {"index": i, "class": str(names[i]) if names and i < len(names) else str(i), "prob": p}
            for p, i in zip(ps, idx, strict=True)
        ]
        results.append({"image": path, "top_k": classes})
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            shown = "  ".join(f"{c['class']} {c['prob']:.4f}" for c in result["top_k"])
            print(f"{result['image']}: {shown}")
    if args.sheet:
        write_sheet(args.sheet, originals, results)
        if not args.json:
            print(f"wrote {args.sheet}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
