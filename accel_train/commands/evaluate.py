"""Evaluate exported weights or a checkpoint on a dataset, under any accelerate config.

    python scripts/eval.py --weights runs/default/model
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml scripts/eval.py \\
        --weights runs/default/checkpoints/step_00000352 --out eval.json --confusion-png confusion.png

Only the dataset's test split is read: ``t10k-*`` alone is enough for mnist/fashion_mnist, ``test_batch``
for cifar10. Evaluation never downloads; ``train.py --download`` fetches the files.

``--dataset imagefolder:DIR`` scores every image of a folder of class subfolders, or its ``test/`` (``val/``)
where it has one (``train/`` + ``test/``, or ``test/`` alone); classes are matched to the model's by folder
name, so a folder may hold some of them. Only the part ``train.py`` held out is scored when ``--val-split``
asks for it, or when DIR is the folder the weights were trained on (with the run's ``--val-split``/``--seed``
from its config.yaml). The report's ``evaluated`` says in one line which images were scored; with ``--out``
that line is printed too, before the accuracy.
"""

from accel_train.cli import ArgumentParser, run_main  # light: no torch
from accel_train.config import MIXED_PRECISION, TTA  # light too: the training flags' own choices
from accel_train.finite_json import finite


def main(argv=None):
    parser = ArgumentParser(description="Evaluate weights on a dataset and write a JSON report.")
    parser.add_argument("--weights", required=True, help="export dir, checkpoint dir, or .safetensors/.pt file")
    parser.add_argument("--dataset", help="dataset name (default: the one recorded with the weights)")
    parser.add_argument("--data-dir", default="data", help="root of on-disk datasets (default: data)")
    parser.add_argument("--batch-size", type=int, default=128, help="evaluation batch per process (default: 128)")
    parser.add_argument("--out", help="write the JSON report here (default: print it); an existing file only with "
                        "--overwrite")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out / --confusion-png")
    parser.add_argument("--confusion-png", help="also write a confusion-matrix PNG")
    parser.add_argument("--image-column", help="image column of an hf: dataset (default: detected)")
    parser.add_argument("--label-column", help="label column of an hf: dataset (default: detected)")
    parser.add_argument("--mixed-precision", choices=MIXED_PRECISION, help="override the accelerate config")
    parser.add_argument("--tta", choices=TTA, default="none", help="flip: average each image's and its mirror's logits")
    parser.add_argument(
        "--val-split",
        type=float,
        metavar="FRACTION",
        help="imagefolder of classes: score only the part train.py --val-split FRACTION holds out (0: every image; "
        "default: every image, or the run's split for the folder the weights trained on)",
    )
    parser.add_argument(
        "--seed", type=int, help="with --val-split: the training run's --seed (default: the run's, else 42)"
    )
    parser.add_argument(
        "--allow-import", action="store_true", help="let the weights' config import the user code it names as model"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.val_split is not None and not 0 <= args.val_split < 1:
        parser.error(f"--val-split must be at least 0 and below 1, got {args.val_split}")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        parser.error(f"--seed must be between 0 and 2**32 - 1, got {args.seed}")

    _check_outputs(args)  # before the weights, the data or torch are loaded
    import json

    from accel_train.heap import importing

    with importing():  # torch, and the metric's evaluate with datasets and pandas: no garbage collection meanwhile
        import evaluate  # noqa: F401  (the report's metric: loaded with the rest, see heap.py)

        from accel_train.checkpoint.weights import user_code_allowed
        from accel_train.saved_eval import run_evaluation

    with user_code_allowed(args.allow_import):
        report = run_evaluation(
            args.weights,
            args.dataset,
            args.data_dir,
            args.batch_size,
            args.out,
            args.confusion_png,
            args.mixed_precision,
            image_column=args.image_column,
            label_column=args.label_column,
            tta=args.tta,
            val_split=args.val_split,
            seed=args.seed,
        )
    if report is None:  # not the main process
        return 0
    if args.out:  # printed, the report says it too ("evaluated")
        print(f"evaluated {report['evaluated']}")
        print(f"accuracy {report['accuracy']:.4f} on {report['samples']} samples; wrote {args.out}")
    else:
        shown = {k: v for k, v in report.items() if k != "confusion_matrix"}
        print(json.dumps(finite(shown, "the evaluation"), indent=2, allow_nan=False))
    return 0


def _check_outputs(args) -> None:
    """--out and --confusion-png: refused in one line before the weights, the data or torch are loaded."""
    from accel_train.outputs import check_output_file, weights_inputs

    inputs = weights_inputs(args.weights)
    if args.dataset and ":" in args.dataset:  # imagefolder:PATH, hf:PATH: a PNG written there would become data
        inputs.append(args.dataset.split(":", 1)[1])
    for flag, path, suffix in (("--out", args.out, ".json"), ("--confusion-png", args.confusion_png, ".png")):
        if path:  # different extensions: never the same file
            check_output_file(path, flag, suffixes=(suffix,), overwrite=args.overwrite, inputs=inputs)


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
