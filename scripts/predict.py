#!/usr/bin/env python
"""Classify images with exported weights (``DIR/model.safetensors`` + ``DIR/config.json``).

The same program as the ``accel-predict`` console script; its code and examples are in
``accel_train/commands/predict.py``, its flags in ``--help``.
"""

from accel_train.commands.predict import cli_main

if __name__ == "__main__":
    cli_main()
