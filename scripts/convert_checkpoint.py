#!/usr/bin/env python
"""Inspect a weights file/directory, or convert it to a clean ``DIR/model.safetensors`` + ``config.json``.

The same program as the ``accel-convert`` console script; its code and examples are in
``accel_train/commands/convert.py``, its flags in ``--help``.
"""

from accel_train.commands.convert import cli_main

if __name__ == "__main__":
    cli_main()
