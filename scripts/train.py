#!/usr/bin/env python
"""Train with one Accelerate loop on any setup.

The same program as the ``accel-train`` console script; its code and examples are in
``accel_train/commands/train.py``, its flags in ``--help``.
"""

from accel_train.commands.train import cli_main

if __name__ == "__main__":
    cli_main()
