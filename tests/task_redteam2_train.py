"""Two-process runs for tests/integration/test_task_redteam2_runs.py (the second red-team round on the generic task).

    accelerate launch --config_file accelerate_configs/multi_cpu.yaml tests/task_redteam2_train.py OUT CASE

Cases: ``monitor_one_eval`` (an eval set of one sample, so rank 0's eval block is empty, and a monitor no metric
gives: every rank must stop on the one-line refusal, none on a lost peer). A refusal is printed as the command
line prints it (``error: <message>``) and exits with its code.
"""

from __future__ import annotations

import os
import sys

import task_redteam_train as rt
import torch
from torch import nn
from torch.utils.data import TensorDataset

import accel_train
from accel_train.errors import AccelTrainError


def run(out: str, case: str) -> dict:
    folder = os.path.join(out, case)
    if case == "monitor_one_eval":
        x = rt.features(33)
        y = (x[:, 0] > 0).long()
        data, test = TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])
        options = {**rt.BASE, "max_steps": 4, "eval_every": 2}
        return accel_train.train(lambda: nn.Linear(4, 2), data, test, monitor="f1", output_dir=folder, **options)
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        run(sys.argv[1], sys.argv[2])
    except AccelTrainError as exc:
        print(f"rank {os.environ.get('RANK', '0')}: error: {exc}", flush=True)
        sys.exit(exc.exit_code)
