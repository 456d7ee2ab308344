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

Converting writes tensors and the saved model config; it builds a model only to check that the weights fit it:
the model named by ``--model``, a built-in or ``tv:`` model the config names, or your own
``package.module:callable`` with ``--allow-import``. Your own code is otherwise never imported: a model defined
in your training script (``__main__:Net``), given to ``accel_train.train`` as an object, or named by a config
without ``--allow-import`` has its tensors and config copied as saved; load them into the module you build
with ``accel_train.checkpoint.load_weights(model, DIR)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from accel_train.cli import ArgumentParser, run_main  # light: no torch
from accel_train.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description="Inspect a checkpoint, or write it as a clean model.safetensors (+ config.json) with --out."
    )
    parser.add_argument("source", help="weights file or directory (export, checkpoint, accelerate save_state)")
    parser.add_argument("--out", help="write DIR/model.safetensors (+ DIR/config.json when the model is known)")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
    parser.add_argument("--model", help="model name; the weights are verified to load strictly into it")
    parser.add_argument(
        "--allow-import",
        action="store_true",
        help="import the package.module:callable the source's config names, to check the weights fit it "
        "(without it, your model's weights are copied unchecked)",
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
    found = [Path(out).expanduser() / name for name in EXPORT_FILES if (Path(out).expanduser() / name).exists()]
    if found:
        raise UserError(
            f"--out {out} already holds an export ({found[0]}); pass --overwrite to replace it, or choose another --out"
        )


def _why_not_built(spec: str, args: argparse.Namespace) -> str | None:
    """Why the model the saved config names is not built to check the weights; None: build it."""
    from accel_train.models import is_user_code
    from accel_train.models.user import is_instance_label, is_main_script

    if args.model is not None:
        return None  # named on the command line: building it is what was asked
    if is_instance_label(spec):
        return f"{spec} was an nn.Module object given to accel_train.train(), which no config rebuilds"
    if not is_user_code(spec):
        return None  # a built-in or tv: model: nothing of yours is imported
    if is_main_script(spec):
        return f"{spec} was defined in the script that trained it, which no other program can import"
    if not args.allow_import:
        return f"{spec} is your code, imported only with --allow-import"
    return None


def _refuse_unchecked_sizes(saved: dict | None, given: dict, spec: str) -> None:
    """Sizes from the flags that differ from the saved config would go unchecked into config.json."""
    for key, value in given.items():
        if value is not None and (saved or {}).get(key) != value:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{flag} {value} differs from the saved config ({key}={(saved or {}).get(key)}), and convert copies "
                f"the weights of {spec} without building it, so nothing would check it; drop {flag}"
            )


def _export(args: argparse.Namespace, overrides: dict) -> tuple[Path, dict | None, list[str], str | None]:
    """Write the export: (weights path, config written, prefixes removed, why the model was not built)."""
    from accel_train.checkpoint.weights import export_weights, load_model, read_state_dict, saved_model_config

    sd, meta = read_state_dict(args.source)
    if args.model is None and meta["model_config"] is None:
        return export_weights(sd, args.out, None), None, meta["prefixes"], "no model config is saved with them"
    config = saved_model_config(meta, args.model, **overrides)  # checked; nothing imported
    why = _why_not_built(str(config["model"]), args)
    if why is None:  # rebuild it, verify a strict load, export exactly its keys
        model, config = load_model(args.source, model_name=args.model, allow_import=args.allow_import, **overrides)
        return export_weights(model, args.out, config), config, meta["prefixes"], None
    _refuse_unchecked_sizes(meta["model_config"], overrides, str(config["model"]))
    return export_weights(sd, args.out, config), config, meta["prefixes"], why


def run(args: argparse.Namespace) -> int:
    import json

    from accel_train.checkpoint.weights import inspect_checkpoint

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
    weights, config, prefixes, why = _export(args, overrides)
    result = {
        "weights": str(weights),
        "config": str(weights.parent / "config.json") if config is not None else None,
        "model_config": config,
        "prefixes_removed": prefixes,
        "model_built": why is None,  # the weights were loaded strictly into the model they name
        "not_built_because": why,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"wrote {result['weights']}")
    if config is None:
        print("no config.json written: the model is unknown; pass --model NAME (and sizes) to write one")
    else:
        print(f"wrote {result['config']}")
        if why is not None:
            print(
                f"the tensors were copied as saved, without building the model ({why}); load them in your code "
                f"with accel_train.checkpoint.load_weights(model, {args.out!r})"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
