"""Inspect a weights file/directory, or convert it to a clean ``DIR/model.safetensors`` + ``config.json``.

Examples::

    python scripts/convert_checkpoint.py model_parameter.pkl            # inspect
    python scripts/convert_checkpoint.py model_parameter.pkl --json     # inspect, as JSON
    python scripts/convert_checkpoint.py model_parameter.pkl --out exported/ \\
        --model mnist_cnn --num-classes 10 --in-channels 1 --image-size 28

Accepts everything ``accel_train.checkpoint.weights.read_state_dict`` does: our
exports and checkpoint directories, accelerate ``save_state`` directories,
``.pt/.pth/.pkl/.bin`` state dicts (also wrapped in ``{"state_dict": ...}``),
``module.``/``_orig_mod.`` prefixes. Pickles are loaded with ``weights_only=True``.
"""

from __future__ import annotations

import argparse

from accel_train.cli import ArgumentParser, run_main  # light: no torch


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description="Inspect a checkpoint, or write it as a clean model.safetensors (+ config.json) with --out."
    )
    parser.add_argument("source", help="weights file or directory (export, checkpoint, accelerate save_state)")
    parser.add_argument("--out", help="write DIR/model.safetensors (+ DIR/config.json when the model is known)")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
    parser.add_argument("--model", help="model name; the weights are verified to load strictly into it")
    parser.add_argument(
        "--allow-import", action="store_true", help="let the source's config import the user code it names as model"
    )
    parser.add_argument("--num-classes", type=int)
    parser.add_argument("--in-channels", type=int)
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def _format_inspection(info: dict) -> str:
    lines = [
        f"path:        {info['path']}",
        f"format:      {info['format']} ({info['kind']})",
        f"entry:       {info['entry'] or '-'}",
        f"prefixes:    {', '.join(info['prefixes']) or '-'}"
        + (f" (on some keys only: {', '.join(info['mixed_prefixes'])})" if info["mixed_prefixes"] else ""),
        f"tensors:     {info['num_tensors']}",
        f"parameters:  {info['num_parameters']:,}",
        f"size:        {info['size_bytes']:,} bytes",
    ]
    config = info["model_config"]
    lines.append(f"config:      {', '.join(f'{k}={v}' for k, v in config.items()) if config else '-'}")
    width = max([len("name")] + [len(t["name"]) for t in info["tensors"]])
    lines += ["", f"{'name':<{width}}  {'shape':<20}  dtype"]
    lines += [f"{t['name']:<{width}}  {t['shape']!s:<20}  {t['dtype']}" for t in info["tensors"]]
    return "\n".join(lines)


EXPORT_FILES = ("model.safetensors", "config.json")


def _refuse_existing_export(out: str) -> None:
    """An export already in ``out`` is replaced only with ``--overwrite``."""
    from pathlib import Path

    from accel_train.errors import UserError

    found = [Path(out).expanduser() / name for name in EXPORT_FILES if (Path(out).expanduser() / name).exists()]
    if found:
        raise UserError(
            f"--out {out} already holds an export ({found[0]}); pass --overwrite to replace it, or choose another --out"
        )


def run(args: argparse.Namespace) -> int:
    import json

    from accel_train.checkpoint.weights import export_weights, inspect_checkpoint, load_model, read_state_dict

    overrides = {"num_classes": args.num_classes, "in_channels": args.in_channels, "image_size": args.image_size}
    if args.out is None:
        info = inspect_checkpoint(args.source)
        print(json.dumps(info, indent=2) if args.json else _format_inspection(info))
        return 0

    from accel_train.outputs import check_output_folder

    # a file, under a file, unwritable, the input or inside it, a run's own folder (RUN/model, RUN/best, ...)
    check_output_folder(args.out, "--out", inputs=[args.source], writes=EXPORT_FILES)
    if not args.overwrite:
        _refuse_existing_export(args.out)
    sd, meta = read_state_dict(args.source)
    if args.model is not None or meta["model_config"] is not None:
        # the model is known: rebuild it, verify a strict load, export exactly its keys
        model, config = load_model(args.source, model_name=args.model, allow_import=args.allow_import, **overrides)
        weights = export_weights(model, args.out, config)
    else:
        config = None
        weights = export_weights(sd, args.out, None)
    result = {
        "weights": str(weights),
        "config": str(weights.parent / "config.json") if config is not None else None,
        "model_config": config,
        "prefixes_removed": meta["prefixes"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"wrote {result['weights']}")
        if config is not None:
            print(f"wrote {result['config']}")
        else:
            print("no config.json written: the model is unknown; pass --model NAME (and sizes) to write one")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
