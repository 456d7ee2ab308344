#!/usr/bin/env python
"""Check this machine and accelerate config files before ``accelerate launch``.

The same program as the ``accel-doctor`` console script; its code and examples are in
``accel_train/commands/doctor.py``, its flags in ``--help``.
"""

from accel_train.commands.doctor import cli_main

if __name__ == "__main__":
    cli_main()
