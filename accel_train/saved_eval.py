"""``accel-evaluate`` / ``scripts/eval.py``: exported weights or a checkpoint, evaluated exactly on a dataset's test
split under any accelerate config, with a JSON report. The loop's own evaluation is ``evaluation.evaluate_model``.

Which images are scored is never left to a default that drops some silently: a dataset's test split; a folder
of class subfolders or of shards whole (its ``test/`` or ``val/`` where it has one); only the part ``train.py``
held out when asked (``--val-split``) or when the data is what the weights trained on (with that run's
``--val-split`` and ``--seed``, read from its config.yaml). The report's ``evaluated`` says which.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from accel_train.config import TrainConfig
from accel_train.errors import CheckpointError, UserError
from accel_train.evaluation import evaluate_model
from accel_train.finite_json import finite
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
    if dataset is None and model_config.get("dataset"):
        dataset = model_config["dataset"]
        kind, _, path = dataset.partition(":")
        where = Path(path).expanduser()
        if kind in ("imagefolder", "shards") and not where.is_absolute() and not where.exists():
            raise UserError(
                f"{weights} records its dataset as {dataset!r}, a path relative to the folder it trained in; run "
                f"eval.py from there, or pass --dataset {kind}:<its path from here>"
            )
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


def _run_split(weights: str, dataset: str) -> tuple[dict[str, Any], Path | None]:
    """``val_split`` and ``seed`` from the config.yaml of the run that wrote ``weights`` (RUN/model, RUN/best,
    RUN/checkpoints/step_N), when it trained on ``dataset``; ({}, None) when there is none to read."""
    import yaml

    from accel_train.run_dir import CONFIG

    here = Path(weights).expanduser().absolute()
    here = here if here.is_dir() else here.parent
    for path in (here.parent / CONFIG, here.parent.parent / CONFIG):
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, UnicodeError, yaml.YAMLError):
            saved = None
        if isinstance(saved, dict) and saved.get("dataset") == dataset:
            split, seed = saved.get("val_split"), saved.get("seed")
            if isinstance(split, float) and 0 < split < 1 and isinstance(seed, int) and not isinstance(seed, bool):
                return {"val_split": split, "seed": seed}, path
    return {}, None


def _same_folder(dataset: str, b: str | None) -> bool:
    """Whether ``dataset`` (``imagefolder:a``, ``shards:a``, ``hf:a``) and the recorded dataset ``b`` name the
    same folder (or Hub name) of the same kind, as seen from here."""
    prefix, _, a = dataset.partition(":")
    if not b or not b.startswith(f"{prefix}:"):
        return False
    return Path(a).expanduser().resolve() == Path(b.split(":", 1)[1]).expanduser().resolve()


def _own_split(dataset: str) -> Path | None:
    """Where ``imagefolder:``/``shards:`` data keeps a test split of its own (None: it has none, or no folder
    is there: the builder then names the problem)."""
    kind, _, path = dataset.partition(":")
    root = Path(path).expanduser().absolute()
    if not root.is_dir():
        return None
    if kind == "shards":
        from accel_train.data.shards import find_shards

        return root if find_shards(root)[1] is not None else None
    from accel_train.data.folder import imagefolder_layout

    layout, folder = imagefolder_layout(root)
    return folder if layout != "classes" else None


def _folder_split(cfg: TrainConfig, weights: str, recorded: str | None, given: bool, val_split, seed) -> tuple:
    """(held_out, the DataConfig to split by, why) for ``imagefolder:`` or ``shards:`` data without a split of its
    own: every image, unless ``--val-split`` asks for the held-out part or the data is what the weights trained on."""
    own = _own_split(cfg.dataset)
    if own is not None and val_split is not None:
        raise UserError(f"{own} has its own test split; drop --val-split, or point at data without one")
    trained_here = not given or _same_folder(cfg.dataset, recorded)
    if own is not None or val_split == 0 or (val_split is None and not trained_here):
        return False, cfg.data_config(), ""
    run, where = _run_split(weights, recorded) if trained_here and recorded else ({}, None)
    split = run.get("val_split", cfg.val_split) if val_split is None else val_split
    data = replace(cfg.data_config(), val_split=split, seed=run.get("seed", cfg.seed) if seed is None else seed)
    if val_split is not None or seed is not None:
        return True, data, ", as asked" + _overlap(run, data)
    source = (
        f"values from {where}"
        if where
        else "train.py's defaults: pass the run's --val-split and --seed if it used others"
    )
    return True, data, f"; the weights trained on the rest ({source}; --val-split 0 scores every image)"


def _overlap(run: dict[str, Any], data) -> str:
    """What a part asked for with other values than the run's (``run``: its recorded split) holds."""
    if run and (run["val_split"], run["seed"]) != (data.val_split, data.seed):
        held = f"--val-split {run['val_split']} --seed {run['seed']}"
        return f" (the run held out {held}: some of these images trained the weights)"
    return ""


def _eval_data(cfg: TrainConfig, weights: str, model_config: dict, given: bool, val_split, seed):
    """The data ``accel-evaluate`` scores, with ``extra["evaluated"]`` saying which images in words."""
    from accel_train.data import build_dataset

    if not cfg.dataset.startswith(("imagefolder:", "shards:")):
        hub = cfg.dataset.startswith("hf:")
        if val_split is not None and not (hub and val_split > 0):
            raise UserError(
                f"--val-split {val_split} is for imagefolder:, shards: (and hf:) data; {cfg.dataset} has a test split"
            )
        run, where = {}, None  # the data the weights trained on: the part their run held out, not the defaults'
        if hub and (not given or _same_folder(cfg.dataset, model_config.get("dataset"))):
            run, where = _run_split(weights, model_config.get("dataset") or cfg.dataset)
        asked = val_split is not None or seed is not None
        data = replace(
            cfg.data_config(),
            val_split=val_split or run.get("val_split", cfg.val_split),
            seed=run.get("seed", cfg.seed) if seed is None else seed,
        )
        splits = build_dataset(data, test_only=True, download_hint=FETCH_HINT)
        held = f"the part --val-split {data.val_split} --seed {data.seed} holds out"
        held += ", as asked" + _overlap(run, data) if asked else f", from {where}" if where else ""
        splits.extra["evaluated"] = f"the test split of {cfg.dataset}" + (
            f" (where it has none: {held})" if hub else ""
        )
        return splits
    from accel_train.data.folder import build_imagefolder_eval
    from accel_train.data.shards import build_shards_eval

    held_out, data, why = _folder_split(cfg, weights, model_config.get("dataset"), given, val_split, seed)
    channels, names = model_config["in_channels"], model_config.get("class_names")
    build = build_shards_eval if cfg.dataset.startswith("shards:") else build_imagefolder_eval
    splits = build(data, cfg.dataset.split(":", 1)[1], held_out, channels, names)
    splits.extra["evaluated"] += why
    return splits


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
    val_split: float | None = None,
    seed: int | None = None,
) -> dict[str, Any] | None:
    """Load ``weights`` (export dir, checkpoint dir or state-dict file), evaluate, write a JSON report.

    Only the dataset's test split is loaded (its training files need not exist). An ``imagefolder:`` folder of
    class subfolders (or a ``shards:`` folder without a test split) is scored whole, unless ``val_split`` asks for
    the part ``train.py --val-split --seed`` holds out (0: every image) or the data is what the weights trained
    on (then its run's held-out part); the report's ``evaluated`` says which images were scored. Collective under
    several processes; returns the report on the main process and None elsewhere.
    """
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
    given, dataset = dataset is not None, cfg.dataset
    rt = build_runtime(cfg)
    acc = rt.accelerator
    with acc.main_process_first():
        splits = _eval_data(cfg, weights, model_config, given, val_split, seed)
    trained_here = not given or _same_folder(dataset, model_config.get("dataset"))
    changed = _data_change(model_config, splits, trained_here, weights)
    if changed:  # on stderr: the report may be what stdout holds
        rt.warn(f"{dataset} is not the data the weights recorded: {changed}")
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
    result = evaluate_model(acc, model, loader, BatchNormalizer(mean, std), metric, info.num_classes, True, tta=tta)
    names = model_config.get("class_names") or info.class_names
    report = _report(weights, dataset, splits.extra["evaluated"], result, names, acc, tta)
    report["data_changed"] = changed
    if rt.is_main:
        hint = f"{weights} may hold NaN/Inf weights (a diverged run); evaluate another checkpoint"
        report = finite(report, "the evaluation report", hint)
        if out:
            _write_report(out, report)
        if confusion_png:
            from accel_train.plots import plot_confusion_matrix

            names = [str(n) for n in report["per_class_accuracy"]]
            plot_confusion_matrix(result["confusion"].numpy(), names, confusion_png, title=f"{dataset}")
    rt.end()
    return report if rt.is_main else None


def _data_change(model_config: dict, splits, trained_here: bool, weights: str) -> str | None:
    """How the data scored now differs from what the weights recorded of it (their run's data.identity), for the
    parts both know, by file where their run folder kept its file list; None when it is the same, other data, or
    the weights record none."""
    from accel_train.data.identity import changes, load_files, of_splits
    from accel_train.run_dir import DATA_FILES

    recorded, now = model_config.get("data"), of_splits(splits)
    if not trained_here or not isinstance(recorded, dict) or now is None or not isinstance(recorded.get("parts"), dict):
        return None
    parts = tuple(sorted(set(recorded["parts"]) & set(now.parts)))
    if now.kind not in ("imagefolder", "shards", "hf") or not parts:  # built-in data: what its name and flags say
        return None
    here = Path(weights).expanduser().absolute()
    here = here if here.is_dir() else here.parent
    lists = (
        load_files(folder / DATA_FILES, str(recorded.get("digest"))) for folder in (here.parent, here.parent.parent)
    )
    return changes(recorded, now, next((f for f in lists if f), None), parts=parts)


def _report(weights: str, dataset: str, evaluated: str, result: dict, names: list, acc, tta: str) -> dict[str, Any]:
    confusion = result["confusion"]
    counts = confusion.sum(1)
    per_class = (confusion.diag().double() / counts.clamp(min=1).double()).tolist()
    per_class = [a if n else None for a, n in zip(per_class, counts.tolist(), strict=True)]  # no samples: no score
    return {
        "weights": str(weights),
        "dataset": dataset,
        "evaluated": evaluated,
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


def _write_report(out: str, report: dict[str, Any]) -> None:
    """The JSON report, written whole or not at all (where ``out`` really leads: a link stays a link)."""
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    real = Path(os.path.realpath(Path(out).expanduser()))
    with writing(real, "the evaluation report"):
        real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, lambda tmp: Path(tmp).write_text(text), "the evaluation report")
