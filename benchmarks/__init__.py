"""The benchmark harness (not part of the accel_train package), one folder per purpose:

* ``speed/``: the portable loop against a plain PyTorch loop and the seed-000 recipe (``python -m benchmarks
  [--quick]``, ``scripts/benchmark.py``), and ``python -m benchmarks busy-threads``;
* ``data/``: the user's own images at scale (``python -m benchmarks data-scale``) and in a first folder
  (``python -m benchmarks shapes``, ``photos``);
* ``gpu_acceptance/``: the GPU checks (``scripts/gpu_acceptance.py``);
* ``kills/``: the kill campaign (``scripts/soak.py kills``);

and ``common.py``, the helpers they share. Each folder's ``__init__.py`` says which file does what.
"""
