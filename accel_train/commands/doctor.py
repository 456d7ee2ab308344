"""Check this machine and accelerate config files before ``accelerate launch``.

    python scripts/doctor.py
    python scripts/doctor.py --config_file accelerate_configs/multi_cpu.yaml [--json]
    python scripts/doctor.py --config_file accelerate_configs/multi_cpu.yaml --smoke

Prints the devices the seeds' ``try_gpu()``/``try_all_gpus()`` would see, then for
each config the launch plan (launcher, processes, backend, device, precision), as
accelerate's own ``accelerate launch`` code resolves it, and its findings. ``--smoke``
also launches 2 real training steps under the config and sets what the run recorded
beside the plan. Exit 1 if any config has an error finding (a smoke run that fails or
disagrees with the plan is one), 2 on a usage error, else 0.
"""

from accel_train.cli import ArgumentParser, run_main  # light: no torch


def _parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config_file",
        nargs="+",
        action="extend",
        default=[],
        metavar="F",
        help="accelerate config file(s) to check (repeatable)",
    )
    parser.add_argument("--cpu", action="store_true", help="as if launched with `accelerate launch --cpu`")
    parser.add_argument(
        "--num_processes", type=int, metavar="N", help="as if launched with `accelerate launch --num_processes N`"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="also launch 2 training steps of scripts/train.py under each config (small synthetic data) and "
        "compare world size, distributed type, device and precision with the plan",
    )
    parser.add_argument(
        "--smoke-dir", metavar="DIR", help="keep the smoke runs' folders in DIR (default: a temporary folder, removed)"
    )
    parser.add_argument(
        "--smoke-timeout", type=float, default=600, metavar="S", help="seconds one smoke launch may take (default: 600)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from accel_train.errors import UserError

    if args.num_processes is not None and args.num_processes < 1:
        raise UserError(f"--num_processes {args.num_processes} is invalid: give 1 or more")
    if args.smoke and not args.config_file:
        raise UserError("--smoke launches a config: add --config_file F")
    launch_args = ("--num_processes", str(args.num_processes)) if args.num_processes else ()

    import contextlib
    import tempfile
    from pathlib import Path

    from accel_train import doctor

    env = doctor.Environment.detect()
    diagnoses = [doctor.diagnose_config(p, env, cpu=args.cpu, launch_args=launch_args) for p in args.config_file]
    if args.smoke:
        with contextlib.ExitStack() as stack:
            if args.smoke_dir:
                Path(args.smoke_dir).mkdir(parents=True, exist_ok=True)
            root = args.smoke_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="accel-doctor-"))
            for diag in diagnoses:
                launch = ("--cpu",) * args.cpu + launch_args
                doctor.run_smoke(diag, Path(root), launch, args.smoke_timeout, kept=bool(args.smoke_dir))
    if args.json:
        print(doctor.format_json(env, diagnoses))
    else:
        print(doctor.format_report(env, diagnoses), end="")
    return 0 if all(d.ok for d in diagnoses) else 1


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
