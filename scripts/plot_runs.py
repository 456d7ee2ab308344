#!/usr/bin/env python
"""Overlay the curves of several runs and print a comparison table.

The same program as the ``accel-plot-runs`` console script; its code and examples are in
``accel_train/commands/plot_runs.py``, its flags in ``--help``.
"""

from accel_train.commands.plot_runs import cli_main

if __name__ == "__main__":
    cli_main()
