"""Check this machine and accelerate config files before ``accelerate launch``.

    python scripts/doctor.py
    python scripts/doctor.py --config_file accelerate_configs/multi_cpu.yaml [--json]

Prints the devices the seeds' ``try_gpu()``/``try_all_gpus()`` would see, then for
each config the launch plan (launcher, processes, backend, device, precision) and
its findings. Exit 1 if any config has an error finding, 2 on a usage error, else 0.
"""

from accel_train.cli import ArgumentParser, run_main  # light: no torch


def main(argv: list[str] | None = None) -> int:
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
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)

    from accel_train import doctor

    env = doctor.Environment.detect()
    diagnoses = [doctor.diagnose_config(path, env, cpu=args.cpu) for path in args.config_file]
    if args.json:
        print(doctor.format_json(env, diagnoses))
    else:
        print(doctor.format_report(env, diagnoses), end="")
    return 0 if all(d.ok for d in diagnoses) else 1


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
