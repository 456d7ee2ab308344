"""Classify images with exported weights (``DIR/model.safetensors`` + ``DIR/config.json``).

Example::

    python scripts/predict.py --weights exported/ digit1.png digit2.png --top-k 3

Each image is converted to L or RGB (by the model's ``in_channels``), resized to
``image_size``, scaled to [0, 1] and normalised with the config's ``mean``/``std``;
the model runs on CPU. Prints the top-k classes (``class_names`` or indices) per image.
"""

from __future__ import annotations

import argparse

from accel_train.cli import ArgumentParser, run_main  # light: no torch


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description="Classify images with exported weights, on CPU.")
    parser.add_argument("--weights", required=True, help="export or checkpoint directory (or weights file)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--top-k", type=int, default=3, help="classes to print per image (default 3)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
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


def _load_images(paths: list[str], config: dict):
    import torch

    from accel_train.data.images import read_image  # regular files only, a pixel limit, one-line errors
    from accel_train.errors import UserError

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
        array = read_image(path, "L" if channels == 1 else "RGB", size) / 255.0
        tensor = torch.from_numpy(array.copy())
        tensor = tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)
        batch.append((tensor - mean) / std)
    return torch.stack(batch)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from accel_train.checkpoint.weights import load_model
    from accel_train.errors import UserError

    if args.top_k < 1:
        raise UserError("--top-k must be at least 1")
    model, config = load_model(args.weights)
    inputs = _load_images(args.images, config)
    with torch.no_grad():
        probs = torch.softmax(model(inputs).float(), dim=1)
    names = config.get("class_names")
    k = min(args.top_k, probs.shape[1])
    top_p, top_i = probs.topk(k, dim=1)
    results = []
    for path, ps, idx in zip(args.images, top_p.tolist(), top_i.tolist(), strict=True):
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
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
