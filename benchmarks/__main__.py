"""Benchmark the portable loop against a plain PyTorch loop and the seed-000 recipe on this machine.

python -m benchmarks --quick --out runs/bench_quick      # under 3 minutes
python -m benchmarks --out runs/bench --data-dir data     # full: repeats, bf16 study, MNIST time to 97%

Workloads: CPU setups train MNIST-shaped 1x28x28 synthetic data at batch 16-32; CUDA setups (where a GPU is
visible) train CIFAR-shaped 3x32x32 synthetic data with resnet18 at batch 512, each pinned to one GPU
(CUDA_VISIBLE_DEVICES), with TF32 set alike for the GEMM peak and both loops. --workload picks one for all.

CIFAR-10 time to 94% (--speedrun, on by default where a GPU is visible): airbench's recipe
(configs/airbench_cifar10.yaml) through scripts/train.py, its training time beside airbench's published figures;
python -m benchmarks.speed.speedrun runs it alone.

Writes OUT/benchmark.json, OUT/benchmark.md and OUT/benchmark.png (see benchmarks/speed/run.py).

python -m benchmarks data-scale --root DIR [--train 100000]   # an image folder at scale beside torchvision's
(benchmarks/data/scale.py: time to the first step, a second launch, a resume, indexing memory, pipeline images/s)

python -m benchmarks shapes [--seeds 0,1,2] [-- FLAGS]   # the README's folder command on drawn shapes, 3 seeds
(benchmarks/data/own_folder.py: test accuracy, the memorisation warning, seconds from process start, CPU seconds)

python -m benchmarks photos [--folder DIR] [--torch-home DIR]   # photos: fine-tuned beside from scratch
(benchmarks/data/own_folder.py: the default's choice, accuracy, seconds, CPU seconds)
python -m benchmarks busy-threads [--rounds 3] [--hogs 1]   # a run beside a busy process: all cores, 1, the default
(benchmarks/speed/busy_threads.py: samples/s idle and beside CPU hogs, side by side, and the threads the default chose)
"""

import sys
from pathlib import Path


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _parser():
    """The command line; its errors are one-line ``UserError``s (exit 2, no traceback)."""
    import argparse

    from accel_train.errors import UserError

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UserError(f"{message} (see --help)")

    parser = Parser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("--out", default="runs/benchmark", help="output folder (default: runs/benchmark)")
    parser.add_argument("--quick", action="store_true", help="few steps, 1 repeat, short caps: under 3 minutes")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder holding MNIST/raw/*-ubyte[.gz] (full mode: MNIST time to accuracy, and time to 98%% against "
        "pytorch/examples' recipe on it instead of synthetic MNIST-shaped data) and cifar-10-batches-py (the "
        "--speedrun data)",
    )
    parser.add_argument("--models", type=_csv, default=None, help="comma-separated subset of the models")
    parser.add_argument(
        "--setups",
        type=_csv,
        default=None,
        help="comma-separated subset: cpu_fp32, cpu_bf16, gloo_2proc, cpu_fp32_cl, cpu_bf16_cl "
        "(with a GPU: cuda_fp32, cuda_bf16)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default: full 2, quick 1)")
    parser.add_argument(
        "--no-time-to-accuracy",
        dest="time_to_accuracy",
        action="store_false",
        help="skip the time-to-accuracy comparison",
    )
    parser.add_argument(
        "--workload",
        choices=("auto", "mnist", "cifar"),
        default="auto",
        help="auto (default): MNIST-shaped 1x28x28 on CPU, CIFAR-shaped 3x32x32 resnet18 batch 512 on CUDA; "
        "mnist or cifar: that one for every setup",
    )
    parser.add_argument(
        "--no-tf32",
        dest="tf32",
        action="store_false",
        help="CUDA: strict fp32 (TF32 off for matmuls and convolutions) for the GEMM peak and both loops "
        "(default: TF32 on for both)",
    )
    parser.add_argument(
        "--speedrun",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CIFAR-10 time to 94%% with airbench's recipe (configs/airbench_cifar10.yaml; real data from "
        "--data-dir/cifar-10-batches-py, synthetic otherwise) beside airbench's published figures "
        "(default: only where a GPU is visible)",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also rewrite the figures between the benchmark markers of this file (docs/performance.md)",
    )
    parser.add_argument("--keep-runs", action="store_true", help="keep the children's run folders (debugging)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests: lenet, cpu_fp32, few steps
    return parser


def main(argv=None):
    from accel_train.errors import UserError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["shapes"]:
        from benchmarks.data.own_folder import main as shapes

        return shapes(argv[1:])
    if argv[:1] == ["photos"]:
        from benchmarks.data.own_folder import photos_main as photos

        return photos(argv[1:])
    if argv[:1] == ["busy-threads"]:
        from benchmarks.speed.busy_threads import main as busy_threads

        return busy_threads(argv[1:])
    if argv[:1] == ["data-scale"]:
        from benchmarks.data.scale import main as data_scale

        return data_scale(argv[1:])
    args = _parser().parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")

    import shlex

    from benchmarks.speed.report import README_BEGIN, README_END
    from benchmarks.speed.run import run_benchmark
    from benchmarks.speed.setups import BenchOptions

    if args.readme is not None:  # before minutes of measuring, not after
        text = args.readme.read_text() if args.readme.is_file() else ""
        if README_BEGIN not in text or README_END not in text:
            raise UserError(f"--readme {args.readme}: no '{README_BEGIN} ... {README_END}' block to rewrite")

    opts = BenchOptions(
        out=Path(args.out),
        quick=args.quick,
        smoke=args.smoke,
        data_dir=args.data_dir,
        models=args.models,
        setups=args.setups,
        repeats=args.repeats,
        time_to_accuracy=args.time_to_accuracy,
        keep_runs=args.keep_runs,
        workload=args.workload,
        tf32=args.tf32,
        speedrun=args.speedrun,
        command=shlex.join(["python", "scripts/benchmark.py", *argv]),
        readme=args.readme,
    )
    report = run_benchmark(opts)
    failed = [r for r in report["results"] if r.get("errors")]
    if failed:
        print(f"benchmark: {len(failed)} measurement(s) failed; see {Path(args.out) / 'benchmark.md'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from accel_train.cli import run_main

    run_main(main)
