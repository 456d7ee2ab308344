"""Classify images with exported weights (``DIR/model.safetensors`` + ``DIR/config.json``).

Example::

    python scripts/predict.py --weights exported/ digit1.png my_drawings/ --top-k 3 --sheet sheet.png

Every image is prepared exactly as the model's training (and ``accel-evaluate``'s) images were: read as ``L`` or
``RGB``, resized to ``image_size`` with the same resampler, normalised with the config's ``mean``/``std``; on the
same files, predict and evaluate give the same answers. A step beyond that is added only where the export's record
(``config.json["preprocess"]``, see :mod:`accel_train.preprocess`) proves an image needs it: inverted when every
training image was light-on-dark and this one is dark-on-light (or the reverse), a digit framed as MNIST's were,
a non-square image padded for a model of in-memory square images. ``--raw`` never adds one.

The steps are listed per image: in ``--json`` (``"preprocess"``: step, detail, ``as_trained``), and otherwise on
stderr (the training pipeline once, then each image that got more), stdout keeping one line of top-k classes
per image. Images in folders named after the model's classes (``my_images/test/<class>/``) are scored against
those names: the top-1 is the last line on stderr, and each such image has ``folder_class`` and ``correct`` in
``--json``. The model runs on CPU; ``--sheet`` draws the images and their top class on a contact sheet.
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
        "--raw",
        action="store_true",
        help="only what the training images got (read, resize, normalise): never invert, pad or frame a digit",
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


def _prepare(path: str, channels: int, size: int, record: dict, adapt: bool, originals: list | None):
    """The image file at ``path`` prepared by ``record`` (one-line UserErrors for what cannot be read)."""
    import numpy as np
    import torch

    from accel_train.data.images import DECODE_ERRORS, open_image
    from accel_train.data.pixels import to_8bit
    from accel_train.errors import UserError
    from accel_train.preprocess import prepare_image

    with open_image(path) as image:
        try:
            if originals is not None:  # as read, for the contact sheet
                shown_image = to_8bit(image, path).convert("L" if channels == 1 else "RGB")
                array = np.asarray(shown_image, dtype=np.float32) / 255.0
                shown = torch.from_numpy(array.copy())
                originals.append(shown.unsqueeze(0) if shown.dim() == 2 else shown.permute(2, 0, 1))
            return prepare_image(image, channels, size, record, adapt=adapt)
        except DECODE_ERRORS as exc:
            raise UserError(f"cannot read image {path}: {' '.join(str(exc).split())[:200]}") from None


def _load_images(
    paths: list[str],
    config: dict,
    record: dict | None = None,
    originals: list | None = None,
    steps: list | None = None,
    adapt: bool = True,
):
    """Normalised model inputs [N, C, S, S] for ``paths``, prepared by ``record`` (default: the config's).

    Each image is read and resized as the training images were, then normalised as the loop normalises a batch
    (``BatchNormalizer``); ``adapt`` adds the steps the record proves an image needs (see ``accel_train.preprocess``).
    ``originals``: a list that receives the images as read (for the contact sheet); ``steps``: one list of
    steps per image (``Prepared.steps`` plus the normalisation).
    """
    import torch

    from accel_train.data.pipeline import BatchNormalizer
    from accel_train.errors import UserError
    from accel_train.preprocess import check_preprocess

    record = check_preprocess(config, "config.json") if record is None else record

    channels = int(config.get("in_channels", 1))
    if channels not in (1, 3):
        raise UserError(f"predict reads grayscale (1) or RGB (3) images; the model has in_channels={channels}")
    size = int(config.get("image_size", 28))
    mean = _per_channel(config.get("mean", 0.0), channels, "mean")
    std = _per_channel(config.get("std", 1.0), channels, "std")
    if 0 in std:
        raise UserError("config std contains 0; fix config.json")
    batch = []
    for path in paths:
        prepared = _prepare(path, channels, size, record, adapt, originals)
        batch.append(prepared.pixels)
        if steps is not None:
            shown = ", ".join(f"{v:g}" for v in mean), ", ".join(f"{v:g}" for v in std)
            normalise = {"step": "normalize", "detail": f"mean [{shown[0]}], std [{shown[1]}]", "as_trained": True}
            steps.append([*prepared.steps, normalise])
    return BatchNormalizer(mean, std)(torch.stack(batch))


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

    from accel_train.fsio import atomic_write, writing
    from accel_train.plots import new_figure

    n = min(len(images), MAX_SHEET)
    cols = min(n, 8)
    rows = math.ceil(n / cols)
    fig = new_figure(figsize=(1.6 * cols, 1.9 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
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
    with writing(real, "the contact sheet"):
        real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, lambda tmp: fig.savefig(tmp, format="png", dpi=100), "the contact sheet")


def explain(results: list[dict], config: dict, record: dict) -> list[str]:
    """The preprocessing in words: the training pipeline every image got, then each image that got more."""
    from accel_train.preprocess import pipeline

    size, channels = int(config.get("image_size", 28)), int(config.get("in_channels", 1))
    where = f"{config['dataset']}'s training images" if config.get("dataset") else "the training images"
    lines = [f"preprocessing: as {where}: {pipeline(record, channels, size)} with config.json's mean/std"]
    extra = 0
    for result in results:
        added = [f"{s['step']} ({s['detail']})" for s in result["preprocess"] if not s["as_trained"]]
        if added:
            extra += 1
            lines.append(f"preprocessing: {result['image']}: also {'; '.join(added)}")
    if not extra:
        lines.append(f"preprocessing: nothing else: no image needed {_ADAPTATIONS[record['fit']]}")
    return lines


_ADAPTATIONS = {"stretch": "inverting", "pad": "inverting or padding", "digit": "inverting or digit framing"}


def score_folders(results: list[dict], names: list | None) -> str | None:
    """The top-1 accuracy against the folders the images are in, where a folder is named after one of the model's
    classes (``my_images/test/<class>/*.png``), in words; each such result gets ``folder_class`` and ``correct``.
    None when no image is in such a folder."""
    from pathlib import Path

    known = {str(name) for name in names or ()}
    scored = [r for r in results if Path(r["image"]).parent.name in known]
    for result in scored:
        result["folder_class"] = Path(result["image"]).parent.name
        result["correct"] = result["top_k"][0]["class"] == result["folder_class"]
    if not scored:
        return None
    right, left_out = sum(r["correct"] for r in scored), len(results) - len(scored)
    unscored = f"; {left_out} images in folders not named after a class are not scored" if left_out else ""
    return f"top-1 against the folder names: {right / len(scored):.4f} ({right}/{len(scored)}{unscored})"


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from accel_train.heap import importing

    with importing():  # torch: no garbage collection while it loads (heap.py)
        from accel_train.checkpoint.weights import load_model
        from accel_train.errors import UserError
        from accel_train.preprocess import check_preprocess

    if args.top_k < 1:
        raise UserError("--top-k must be at least 1")
    if args.sheet:  # before the model and the images are loaded
        from accel_train.outputs import check_output_file, weights_inputs

        inputs = [*weights_inputs(args.weights), *args.images]
        check_output_file(args.sheet, "--sheet", suffixes=(".png",), overwrite=args.overwrite, inputs=inputs)
    paths = _expand(args.images)
    model, config = load_model(args.weights, allow_import=args.allow_import)
    record = check_preprocess(config, f"{args.weights} (config.json)")
    originals: list = []
    steps: list = []
    inputs = _load_images(paths, config, record, originals if args.sheet else None, steps, adapt=not args.raw)
    top_p, top_i = _predict(model, inputs, args.top_k)
    names = config.get("class_names")
    results = []
    for path, ps, idx, done in zip(paths, top_p.tolist(), top_i.tolist(), steps, strict=True):
        classes = [
            {"index": i, "class": str(names[i]) if names and i < len(names) else str(i), "prob": p}
            for p, i in zip(ps, idx, strict=True)
        ]
        results.append({"image": path, "top_k": classes, "preprocess": done})
    scored = score_folders(results, names)  # stderr, last: stdout stays one line per image (or the JSON)
    if args.json:
        from accel_train.finite_json import finite

        print(json.dumps(finite(results, "predict --json"), indent=2, allow_nan=False))
    else:
        for line in explain(results, config, record):  # stderr: stdout stays one line per image
            print(line, file=sys.stderr)
        for result in results:
            shown = "  ".join(f"{c['class']} {c['prob']:.4f}" for c in result["top_k"])
            print(f"{result['image']}: {shown}")
    if args.sheet:
        write_sheet(args.sheet, originals, results)
        if not args.json:
            print(f"wrote {args.sheet}")
    if scored:
        sys.stdout.flush()
        print(scored, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
