"""``accel-evaluate`` / ``scripts/eval.py``: exported weights or a checkpoint, evaluated exactly on a dataset's test
split under any accelerate config, with a JSON report. The loop's own evaluation is ``evaluation.evaluate_model``."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from accel_train.config import TrainConfig
from accel_train.errors import CheckpointError, UserError
from accel_train.evaluation import evaluate_model
from accel_train.fsio import atomic_write, writing

#: How this program's dataset errors say to fetch missing files: evaluation never downloads.
FETCH_HINT = "train.py --download"


def _load_weights(weights: str):
    """``load_model(weights)``; weights that do not record their model get a way out this program has."""
    from accel_train.checkpoint.weights import load_model

    try:
        return load_model(weights)
    except CheckpointError as exc:
        if "no model config found" not in str(exc):  # load_model's hint names flags of other programs
            raise
        raise CheckpointError(
            f"{weights} does not record its model (no config.json or progress.json); write one with "
            f"convert_checkpoint.py {weights} --out DIR --model NAME (and its sizes), then evaluate DIR"
        ) from None


def _eval_config(weights: str, dataset: str | None, data_dir: str, model_config: dict, **settings: Any) -> TrainConfig:
    dataset = dataset or model_config.get("dataset")
    if not dataset:
        raise UserError(f"{weights} does not record its dataset; pass --dataset NAME")
    return replace(
        TrainConfig(),
        dataset=dataset,
        data_dir=data_dir,
        model=model_config["model"],  # checks image_size against this model's minimum
        image_size=model_config.get("image_size"),
        report_to="none",
        **settings,
    ).validate()


def run_evaluation(
    weights: str,
    dataset: str | None = None,
    data_dir: str = "data",
    batch_size: int = 128,
    out: str | None = None,
    confusion_png: str | None = None,
    mixed_precision: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    tta: str = "none",
) -> dict[str, Any] | None:
    """Load ``weights`` (export dir, checkpoint dir or state-dict file), evaluate, write a JSON report.

    Only the dataset's test split is loaded (its training files need not exist). Collective under
    several processes; returns the report on the main process and None elsewhere.
    """
    from accel_train.data import build_dataset
    from accel_train.data.pipeline import BatchNormalizer, make_loader
    from accel_train.metrics import load_metric
    from accel_train.runtime import build_runtime

    model, model_config = _load_weights(weights)
    cfg = _eval_config(
        weights,
        dataset,
        data_dir,
        model_config,
        mixed_precision=mixed_precision,
        output_dir=str(Path(out).parent) if out else ".",
        image_column=image_column,
        label_column=label_column,
    )
    dataset = cfg.dataset
    rt = build_runtime(cfg)
    acc = rt.accelerator
    with acc.main_process_first():
        splits = build_dataset(cfg.data_config(), test_only=True, download_hint=FETCH_HINT)
    metric = load_metric("accuracy")  # writes nothing, on no rank: see accel_train.metrics
    info = splits.info
    if info.num_classes != model_config["num_classes"] or info.in_channels != model_config["in_channels"]:
        raise UserError(
            f"{weights} was trained for {model_config['num_classes']} classes x {model_config['in_channels']} "
            f"channel(s) but {dataset} has {info.num_classes} x {info.in_channels}; pick the matching --dataset"
        )
    mean, std = model_config.get("mean") or info.mean, model_config.get("std") or info.std
    loader = make_loader(splits.test, batch_size, shuffle=False, seed=0, pin_memory=acc.device.type == "cuda")
    model = rt.prepare_model(model)
    model, loader = acc.prepare(model, loader)
    normalizer = BatchNormalizer(mean, std)
    result = evaluate_model(acc, model, loader, normalizer, metric, info.num_classes, True, tta=tta)
    confusion = result.pop("confusion")
    per_class = (confusion.diag().double() / confusion.sum(1).clamp(min=1).double()).tolist()
    names = model_config.get("class_names") or info.class_names
    report = {
        "weights": str(weights),
        "dataset": dataset,
        "accuracy": result["eval_accuracy"],
        "loss": result["eval_loss"],
        "samples": result["eval_samples"],
        "per_class_accuracy": {str(n): a for n, a in zip(names, per_class, strict=True)},
        "confusion_matrix": confusion.tolist(),
        "world_size": acc.num_processes,
        "distributed_type": acc.distributed_type.value,
        "mixed_precision": acc.mixed_precision,
        "tta": tta,
    }
    if rt.is_main:
        report = _finite_json(report, str(weights))
        if out:
            _write_report(out, report)
        if confusion_png:
            from accel_train.plots import plot_confusion_matrix

            plot_confusion_matrix(confusion.numpy(), [str(n) for n in names], confusion_png, title=f"{dataset}")
    rt.end()
    return report if rt.is_main else None


def _write_report(out: str, report: dict[str, Any]) -> None:
    """The JSON report, written whole or not at all (where ``out`` really leads: a link stays a link)."""
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    real = Path(os.path.realpath(Path(out).expanduser()))
    with writing(real, "the evaluation report"):
        real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, lambda tmp: Path(tmp).write_text(text), "the evaluation report")


def _finite_json(report: dict[str, Any], weights: str) -> dict[str, Any]:
    """``report`` with every NaN/Inf number as null (JSON has no NaN), and one warning line when there was one."""
    bad: list[str] = []

    def clean(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(where)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, where) for v in value]
        return value

    cleaned = clean(report, "")
    if bad:
        print(
            f"warning: {', '.join(sorted(set(bad))[:5])} not finite (NaN or Inf), written as null: {weights} may "
            "hold NaN/Inf weights (a diverged run); evaluate another checkpoint",
            file=sys.stderr,
            flush=True,
        )
    return cleaned
