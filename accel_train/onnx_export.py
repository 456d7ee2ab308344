"""A built model as an ONNX file, checked under onnxruntime against torch, with how to prepare its inputs.

``export_onnx(model, config)`` runs ``torch.onnx.export(..., dynamo=True)`` (the ``torch.export``-based exporter,
torch's default since 2.9; the TorchScript one, ``dynamo=False``, is deprecated) with a dynamic batch axis, then
runs the file under onnxruntime on random inputs in batches of sizes other than the one traced (4, then 3) and
compares with the model: the largest absolute difference must stay within ``atol``. Nothing is written before it
does; ``write_onnx`` then writes the file and its preprocessing JSON, each whole.

The input is what the model sees in training: a float32 ``[batch, C, H, W]`` (NCHW) tensor of pixels scaled to
[0, 1] (uint8 / 255) and normalised per channel, ``(x - mean[c]) / std[c]``, as the loop's ``BatchNormalizer``
does; ``preprocessing(config)`` says so with the export's numbers, in the sidecar JSON and in the file's metadata.

onnx, onnxscript and onnxruntime are the ``onnx`` extra (``pip install 'accel_train[onnx]'``); they are imported
only here, only when an export is asked for (``require_onnx``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_train.errors import UserError
from accel_train.fsio import atomic_write, write_json_atomic

PACKAGES = ("onnx", "onnxscript", "onnxruntime")  # the extra: torch.onnx's exporter needs the first two
INSTALL = (
    "pip install 'accel_train[onnx]' (in a checkout: pip install -e '.[onnx]'), or pip install onnx onnxscript "
    "onnxruntime"
)
DEFAULT_ATOL = 1e-4  # fp32: the runtimes' kernels differ in summation order, ~1e-6 on the models here
TRACE_BATCH = 2  # torch.export specialises a batch of 1; the checks then use other sizes
CHECK_BATCHES = (4, 3)
INPUT, OUTPUT, BATCH = "input", "logits", "batch"
METADATA_KEY = "accel_train.preprocessing"  # the sidecar's JSON, also inside the file
MAX_PROTO_BYTES = 2_000_000_000  # protobuf's limit on one file (weights in external files are not written here)


def require_onnx() -> None:
    """One line naming the extra when a package the export needs is missing (or fails to import)."""
    missing = []
    for name in PACKAGES:
        try:
            __import__(name)  # heavy (onnxruntime, onnxscript): only when --onnx is given
        except ImportError as exc:
            missing.append(name if isinstance(exc, ModuleNotFoundError) else f"{name} ({exc})")
    if missing:
        raise UserError(f"ONNX export needs {', '.join(missing)}, which cannot be imported; install: {INSTALL}")


@dataclass
class OnnxExport:
    """A checked ONNX model, not yet written: its bytes, what the check measured, how to prepare its inputs."""

    data: bytes
    max_abs_diff: float
    atol: float
    opset: int
    preprocessing: dict[str, Any]

    def check(self) -> dict[str, Any]:
        """What was exported and measured (the ``--json`` report and the sidecar JSON carry it)."""
        import onnxruntime

        return {
            "exporter": "torch.onnx.export(dynamo=True)",
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "opset": self.opset,
            "dynamic_axes": {INPUT: {"0": BATCH}, OUTPUT: {"0": BATCH}},
            "checked_batches": list(CHECK_BATCHES),
            "max_abs_diff": self.max_abs_diff,
            "atol": self.atol,
        }


def _per_channel(value: Any, channels: int, default: float) -> list[float]:
    values = [default] if value is None else value if isinstance(value, list) else [value]
    return [float(v) for v in values] * (channels if len(values) == 1 else 1)


def preprocessing(config: dict, source: str | None = None) -> dict[str, Any]:
    """How to turn an image into the ONNX model's input, from the export's ``config`` (checked by load_model)."""
    from accel_train.preprocess import check_preprocess, pipeline

    channels, size = int(config["in_channels"]), int(config["image_size"])
    recorded = config.get("mean") is not None and config.get("std") is not None
    record = check_preprocess(config, "config.json")
    words = pipeline(record, channels, size).removesuffix(", normalised")
    colour = {1: "grayscale (PIL mode L)", 3: "RGB, channels in R, G, B order"}.get(channels, f"{channels} channels")
    return {
        "model": config.get("model"),
        "source": source,
        "input": {"name": INPUT, "shape": [BATCH, channels, size, size], "dtype": "float32", "layout": "NCHW"},
        "output": {
            "name": OUTPUT,
            "shape": [BATCH, int(config["num_classes"])],
            "dtype": "float32",
            "meaning": "one logit per class, in class_names order; softmax over them gives probabilities",
        },
        "channels": channels,
        "colour": colour,
        "image_size": size,
        "resize": words,  # what every training image went through; accel-predict adds steps only ``preprocess`` proves
        "pixel_scale": "uint8 pixel values 0..255 divided by 255, to [0, 1]",
        "mean": _per_channel(config.get("mean"), channels, 0.0) if recorded else None,
        "std": _per_channel(config.get("std"), channels, 1.0) if recorded else None,
        "normalize": "x = (pixel / 255 - mean[c]) / std[c] per channel c, as the training loop's BatchNormalizer"
        if recorded
        else "mean and std were not recorded with these weights: normalise as the model was trained",
        "class_names": config.get("class_names"),
        "dataset": config.get("dataset"),
        "preprocess": record,
    }


def _inputs(batch: int, prep: dict, seed: int) -> torch.Tensor:
    """Random images as the model sees them: pixels in [0, 1], normalised with the export's mean and std."""
    channels, size = prep["channels"], prep["image_size"]
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (batch, channels, size, size), generator=gen).float() / 255
    mean = torch.tensor(prep["mean"] or [0.0] * channels).view(1, -1, 1, 1)
    std = torch.tensor(prep["std"] or [1.0] * channels).view(1, -1, 1, 1)
    return (pixels - mean) / std


def _trace(model: nn.Module, example: torch.Tensor, name: str):
    """torch.onnx.export's ONNXProgram, batch axis dynamic; exporter failures are one line (--debug: all)."""
    try:
        return torch.onnx.export(
            model,
            (example,),
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_shapes=({0: BATCH},),
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    except torch.onnx.errors.OnnxExporterError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"torch.onnx.export could not export {name}: {first[:300]}; change the model so torch.export can trace "
            "it (no data-dependent Python control flow, no fixed batch size), rerun with --debug for the details"
        ) from exc
    except ImportError as exc:  # an onnxscript older than this torch's exporter
        raise UserError(f"torch.onnx could not import {exc.name} ({exc}); upgrade the extra: {INSTALL}") from exc


def _session(data: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: the comparison is what is reported
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _largest_difference(model: nn.Module, data: bytes, prep: dict, name: str) -> float:
    """max |onnxruntime - torch| over the check batches (NaN when either gives NaN); a batch the file refuses is
    one line."""
    session = _session(data)
    diffs = []
    for seed, batch in enumerate(CHECK_BATCHES):
        x = _inputs(batch, prep, seed)
        with torch.no_grad():
            expected = model(x)
        try:
            (got,) = session.run([OUTPUT], {INPUT: x.numpy()})
        except Exception as exc:  # onnxruntime's own error types: Fail, InvalidArgument, RuntimeException
            raise UserError(
                f"the ONNX export of {name} fails under onnxruntime on a batch of {batch} "
                f"({' '.join(str(exc).split())[:200]}); the model's code may fix the batch size (x.view(B, -1)): "
                "use x.flatten(1)"
            ) from exc
        if tuple(got.shape) != tuple(expected.shape):
            raise UserError(
                f"the ONNX export of {name} gives shape {tuple(got.shape)} on a batch of {batch}, torch gives "
                f"{tuple(expected.shape)}; the model's code may fix the batch size: use x.flatten(1), not x.view(B, -1)"
            )
        diffs.append((torch.from_numpy(got).double() - expected.double()).abs().max())
    return float(torch.stack(diffs).max())  # torch's max keeps a NaN, Python's max may drop it


def export_onnx(model: nn.Module, config: dict, *, atol: float = DEFAULT_ATOL, source: str | None = None) -> OnnxExport:
    """``model`` (built from ``config``, in eval mode) as checked ONNX bytes; see the module docstring."""
    name = str(config.get("model", type(model).__name__))
    if not (atol > 0 and atol < float("inf")):
        raise UserError(f"--onnx-atol must be a positive number, got {atol!r}; the default is {DEFAULT_ATOL:g}")
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    if size >= MAX_PROTO_BYTES:
        raise UserError(
            f"{name} holds {size / 1e9:.1f} GB of weights, over ONNX's 2 GB for one file; export it from your own "
            "script with torch.onnx.export(model, ..., dynamo=True, external_data=True)"
        )
    bad = [
        n
        for n, t in [*model.named_parameters(), *model.named_buffers()]
        if t.is_floating_point() and not t.isfinite().all()
    ]
    if bad:  # its outputs would be NaN, and the comparison with onnxruntime would blame the tolerance
        raise UserError(
            f"{name}'s weights hold NaN or Inf values ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): "
            "nothing was written; export a checkpoint from before the run diverged"
        )
    prep = preprocessing(config, source)
    model = model.eval().float()
    program = _trace(model, _inputs(TRACE_BATCH, prep, seed=len(CHECK_BATCHES)), name)
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(prep, sort_keys=True)
    data = proto.SerializeToString()
    diff = _largest_difference(model, data, prep, name)
    if not diff <= atol:  # NaN included
        raise UserError(
            f"the ONNX export of {name} differs from torch by up to {diff:.3g} under onnxruntime, over --onnx-atol "
            f"{atol:g}; nothing was written: check the model's ops, or pass a larger --onnx-atol if that is expected"
        )
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxExport(data, diff, atol, int(opset), prep)


def write_onnx(export: OnnxExport, path: str | os.PathLike, sidecar: str | os.PathLike) -> None:
    """Write ``sidecar`` (JSON: how to prepare inputs, and the check), then the file, each whole: a failed write
    leaves no partial file."""
    record = {**export.preprocessing, "onnx_file": Path(path).name, **export.check()}
    write_json_atomic(sidecar, record, "ONNX preprocessing")
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(export.data), "ONNX model")
