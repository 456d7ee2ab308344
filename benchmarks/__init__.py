"""The benchmark harness (not part of the accel_train package): ``python -m benchmarks --help``.

It measures the portable loop (``scripts/train.py`` launched as users launch it) against a
hand-written plain loop and the seed-000 recipe in the same run; ``bench.py`` runs it, and each part has
a module of its own (``setups``, ``portable``, ``plain``, ``plain_server``, ``study``, ``time_to_accuracy``,
``startup``, ``machine``, ``results``, ``goals``, ``report``). The GPU acceptance is ``gpu_suite`` and its
``gpu_*`` modules.
"""
