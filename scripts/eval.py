#!/usr/bin/env python
"""Evaluate exported weights or a checkpoint on a dataset, under any accelerate config.

The same program as the ``accel-evaluate`` console script; its code and examples are in
``accel_train/commands/evaluate.py``, its flags in ``--help``.
"""

from accel_train.commands.evaluate import cli_main

if __name__ == "__main__":
    cli_main()
