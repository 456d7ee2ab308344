"""Train with one Accelerate loop on any setup.

python scripts/train.py                                   # 1 process, defaults: lenet on digits
accelerate launch --config_file accelerate_configs/multi_cpu.yaml scripts/train.py --epochs 4
python scripts/train.py --config configs/seed000_mnist_cnn.yaml --max-steps 100
"""

import sys

from accel_train.cli import run_main


def main(argv=None):
    from accel_train.config import parse_config
    from accel_train.heap import importing

    with importing():  # torch loads here (the config's checks ask the models): no garbage collection meanwhile
        from accel_train.install_check import check_torchvision

        if not {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):  # --help stays without torch
            check_torchvision()  # a torch/torchvision pair that does not fit: one line before anything else
        cfg = parse_config(argv)
        from accel_train.loop import fit  # heavy imports only after --help / argument errors

    summary = fit(cfg)  # also written to OUTPUT_DIR/summary.json
    return summary.get("exit_code", 0)  # 130/143: stopped by SIGINT/SIGTERM with a checkpoint saved


def cli_main() -> None:
    """Console-script entry point (and ``scripts/*.py``)."""
    run_main(main)
