"""Overlay the curves of several runs and print a comparison table.

Usage::

    python scripts/plot_runs.py runs/cpu runs/multi_cpu runs/bf16 --out runs_compare.png
    python scripts/plot_runs.py runs/a runs/b --labels baseline,bigger-lr
    python scripts/plot_runs.py runs/batch32 runs/batch64 --x epoch

The x axis is the optimizer step, unless the runs' global batches differ: a step of a 64-sample
batch is twice the training of a 32-sample one, so the runs are then overlaid by samples seen
(``--x`` chooses). The table and the legend show each run's global batch.
"""

from __future__ import annotations

import argparse

from accel_train.cli import ArgumentParser, run_main  # light: no torch
from accel_train.run_records import X_AXES  # light: no torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description="Overlay the curves of several runs and print a comparison table.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (with metrics.jsonl)")
    parser.add_argument("--out", default="runs_compare.png", help="image to write (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--labels", default=None, help="comma-separated legend labels, one per RUN_DIR")
    parser.add_argument(
        "--x",
        choices=X_AXES,
        default=None,
        help="x axis: optimizer step, samples seen (step x global batch) or epoch "
        "(default: samples when the runs' global batches differ, else step)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback on errors")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from accel_train.errors import UserError
    from accel_train.plots import compare_runs_table, plot_runs

    args = parse_args(argv)
    from accel_train.outputs import check_output_file

    # Before any run is read. RUN_DIR/curves.png, RUN_DIR/metrics.jsonl, ... are that run's own files (a new file
    # beside them is fine). matplotlib writes the format the extension names: PNG, PDF or SVG.
    suffixes = (".png", ".pdf", ".svg")
    check_output_file(args.out, "--out", suffixes=suffixes, overwrite=args.overwrite, runs=args.run_dirs)
    labels = None
    if args.labels is not None:
        labels = [label.strip() for label in args.labels.split(",")]
        if len(labels) != len(args.run_dirs):
            raise UserError(f"--labels has {len(labels)} names for {len(args.run_dirs)} run directories")
    out = plot_runs(args.run_dirs, args.out, labels=labels, x=args.x)
    print(compare_runs_table(args.run_dirs, labels=labels))
    print(f"wrote {out}")
    return 0


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
