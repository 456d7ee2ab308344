#!/usr/bin/env python
"""Benchmark the portable loop: ``python scripts/benchmark.py ARGS`` is ``python -m benchmarks ARGS``.

The harness lives in ``benchmarks/`` (not part of the installed package); this entry point runs it
from any folder, with relative paths (``--out``, ``--data-dir``) read from the folder you are in.
``--help`` lists the setups, workloads and the CIFAR-10 time-to-94% mode.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks", *sys.argv[1:]], {**os.environ, "PYTHONPATH": path})
