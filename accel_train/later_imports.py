"""What a run imports only after its first step, loaded in a thread while it trains (issue 29).

``evaluate`` (with ``datasets`` and ``scipy.stats``, for the metric of the first evaluation) and
``matplotlib`` (for the plots at the end) cost seconds to import and nothing before they are used.
A run starts loading them once its first optimizer step is done, in a thread that overlaps the
import with the steps (PyTorch's kernels release the GIL); where the run reaches an evaluation
first, its own ``import`` waits for the thread's (Python's per-module import lock), so nothing is
imported twice or half. A failed import in the thread is left to fail again, with its message, in
the code that needs it. The thread is not a daemon: a run that ends sooner waits for it rather
than tearing an import down mid-way at exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def _run_all(loaders: tuple[Callable[[], object], ...]) -> None:
    for load in loaders:
        try:
            load()
        except Exception:  # noqa: BLE001 - the code that needs the module imports it again and reports
            pass


def load_soon(*loaders: Callable[[], object]) -> threading.Thread | None:
    """Call ``loaders`` (each imports something) one after the other in a background thread."""
    if not loaders:
        return None
    thread = threading.Thread(target=_run_all, args=(loaders,), name="accel_train-later-imports")
    thread.start()
    return thread


def load_after_first_step(metric, plots: bool, loader) -> threading.Thread | None:
    """A run's later imports: its metric's module (``evaluate``) and, with ``plots``, ``matplotlib.pyplot``.

    Not where the loader forks worker processes: a worker forked while the thread holds an import's lock would
    inherit the lock held, and could wait on it forever."""
    if getattr(loader, "num_workers", 0):
        return None
    loaders = [metric.load_module] if hasattr(metric, "load_module") else []
    if plots:
        from accel_train.plots import load_pyplot

        loaders.append(load_pyplot)
    return load_soon(*loaders)
