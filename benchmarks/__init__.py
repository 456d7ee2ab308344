"""The benchmark harness (not part of the accel_train package): ``python -m benchmarks --help``.

It measures the portable loop (``scripts/train.py`` launched as users launch it) against a
hand-written plain loop and the seed-000 recipe in the same run; ``bench.py`` holds the machinery.
"""
