"""Inspect a weights file/directory, or convert it to a clean ``DIR/model.safetensors`` + ``config.json``.

Examples::

    python scripts/convert_checkpoint.py model_parameter.pkl            # inspect
    python scripts/convert_checkpoint.py model_parameter.pkl --json     # inspect, as JSON
    python scripts/convert_checkpoint.py model_parameter.pkl --out exported/ \\
        --model mnist_cnn --num-classes 10 --in-channels 1 --image-size 28
    python scripts/convert_checkpoint.py runs/default/model --onnx model.onnx   # + model.onnx.json

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

``--onnx FILE`` needs the model built, by the same rules (:mod:`accel_train.onnx_export`: a dynamic batch axis,
checked under onnxruntime against torch, ``FILE.json`` saying how to prepare inputs; the ``onnx`` extra).
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
    parser.add_argument(
        "--onnx",
        metavar="FILE",
        help="write FILE (.onnx): the model built, batch axis dynamic, checked under onnxruntime against torch; "
        "FILE.json says how to prepare inputs (needs: pip install 'accel_train[onnx]')",
    )
    parser.add_argument(
        "--onnx-atol",
        type=float,
        default=1e-4,
        help="largest absolute difference allowed between onnxruntime and torch (default: 1e-4, fp32)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out (or --onnx)")
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
ONLY_WITH_ALLOW_IMPORT = "imported only with --allow-import"


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
        return f"{spec} is your code, {ONLY_WITH_ALLOW_IMPORT}"
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


def _sidecar(onnx_file: str) -> str:
    """The preprocessing JSON beside the ONNX file: ``model.onnx`` -> ``model.onnx.json``."""
    return onnx_file + ".json"


def _onnx_model(args: argparse.Namespace, overrides: dict):
    """The model --onnx exports, built by convert's rules (built-in and tv: models; your code with --allow-import)."""
    from accel_train.checkpoint.weights import load_model, read_state_dict, saved_model_config

    _, meta = read_state_dict(args.source)
    if args.model is None and meta["model_config"] is None:
        raise UserError(
            f"--onnx needs the model built, and no model config is saved with {args.source}; pass --model NAME "
            "with --in-channels, --image-size and --num-classes"
        )
    config = saved_model_config(meta, args.model, **overrides)
    why = _why_not_built(str(config["model"]), args)
    if why is not None and why.endswith(ONLY_WITH_ALLOW_IMPORT):
        raise UserError(f"--onnx needs the model built, and {why}: pass --allow-import if you trust that module")
    if why is not None:
        c, s = config.get("in_channels", "C"), config.get("image_size", "S")
        raise UserError(
            f"--onnx needs the model built, and {why}; export it from your own script: build the model, "
            f"accel_train.checkpoint.load_weights(model, {args.source!r}), then torch.onnx.export(model.eval(), "
            f"(torch.randn(2, {c}, {s}, {s}),), 'model.onnx', dynamo=True, dynamic_shapes=({{0: 'batch'}},))"
        )
    model, config = load_model(args.source, model_name=args.model, allow_import=args.allow_import, **overrides)
    for key in ("in_channels", "image_size", "num_classes"):
        if config.get(key) is None:
            flag = "--" + key.replace("_", "-")
            raise UserError(f"--onnx needs the model's {key}, which is not saved with {args.source}; pass {flag} N")
    return model, config


def _write_onnx(args: argparse.Namespace, overrides: dict) -> dict:
    """--onnx: build, export, check under onnxruntime, write FILE and FILE.json; what was written and measured."""
    from accel_train.onnx_export import export_onnx, write_onnx

    model, config = _onnx_model(args, overrides)
    export = export_onnx(model, config, atol=args.onnx_atol, source=str(args.source))
    write_onnx(export, args.onnx, _sidecar(args.onnx))
    prep = export.preprocessing
    return {
        "file": str(args.onnx),
        "preprocessing": _sidecar(args.onnx),
        "model": config["model"],
        "input": prep["input"],
        "output": prep["output"],
        "normalize": prep["normalize"],
        **export.check(),
    }


def _print_onnx(result: dict) -> None:
    shape = ", ".join(map(str, result["input"]["shape"]))
    print(
        f"wrote {result['file']}: {result['model']}, input {result['input']['name']!r} float32 [{shape}] (NCHW), "
        f"output {result['output']['name']!r} [{', '.join(map(str, result['output']['shape']))}], opset "
        f"{result['opset']}, {result['exporter']}"
    )
    batches = " and ".join(map(str, result["checked_batches"]))
    print(
        f"onnxruntime matches torch: largest absolute difference {result['max_abs_diff']:.2e} on batches of "
        f"{batches} (--onnx-atol {result['atol']:g})"
    )
    print(f"wrote {result['preprocessing']}: how to prepare the NCHW inputs: {result['normalize']}")


def _export_result(args: argparse.Namespace, overrides: dict) -> dict:
    """--out: write the export; what was written."""
    weights, config, prefixes, why = _export(args, overrides)
    return {
        "weights": str(weights),
        "config": str(weights.parent / "config.json") if config is not None else None,
        "model_config": config,
        "prefixes_removed": prefixes,
        "model_built": why is None,  # the weights were loaded strictly into the model they name
        "not_built_because": why,
    }


def _print_export(result: dict, out: str) -> None:
    print(f"wrote {result['weights']}")
    if result["model_config"] is None:
        print("no config.json written: the model is unknown; pass --model NAME (and sizes) to write one")
        return
    print(f"wrote {result['config']}")
    if result["not_built_because"] is not None:
        print(
            f"the tensors were copied as saved, without building the model ({result['not_built_because']}); load "
            f"them in your code with accel_train.checkpoint.load_weights(model, {out!r})"
        )


def _check_outputs(args: argparse.Namespace) -> None:
    """--out and --onnx (with its .json beside it) are checked before any work."""
    from accel_train.outputs import check_output_file, check_output_folder, weights_inputs

    if args.out is not None:
        # a file, under a file, unwritable, the input or inside it, a run's own folder (RUN/model, RUN/best, ...)
        check_output_folder(args.out, "--out", inputs=[args.source], writes=EXPORT_FILES)
        if not args.overwrite:
            _refuse_existing_export(args.out)
    if args.onnx is not None:
        inputs = weights_inputs(args.source)
        check_output_file(args.onnx, "--onnx", suffixes=(".onnx",), overwrite=args.overwrite, inputs=inputs)
        side = _sidecar(args.onnx)
        check_output_file(side, "--onnx (its JSON)", suffixes=(".json",), overwrite=args.overwrite, inputs=inputs)


def run(args: argparse.Namespace) -> int:
    import json

    from accel_train.finite_json import finite

    overrides = {"num_classes": args.num_classes, "in_channels": args.in_channels, "image_size": args.image_size}
    if args.out is None and args.onnx is None:
        from accel_train.checkpoint.weights import inspect_checkpoint

        info = inspect_checkpoint(args.source)
        print(json.dumps(finite(info, "--json"), indent=2, allow_nan=False) if args.json else _format_inspection(info))
        return 0
    _check_outputs(args)
    if args.onnx is not None:
        from accel_train.onnx_export import require_onnx

        require_onnx()  # before any work: one line naming the extra
    result = _export_result(args, overrides) if args.out is not None else {}
    if args.onnx is not None:
        result["onnx"] = _write_onnx(args, overrides)
    if args.json:
        print(json.dumps(finite(result, "--json"), indent=2, allow_nan=False))
        return 0
    if args.out is not None:
        _print_export(result, args.out)
    if args.onnx is not None:
        _print_onnx(result["onnx"])
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
