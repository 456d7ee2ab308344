"""Python's garbage collector in a command's own process: one command, then exit (``cli.run_main``).

Start-up builds millions of long-lived objects: torch, and ``torch._dynamo`` with sympy, which every
``torch.optim`` optimizer imports when it is made (a plain torch script pays them too). Python's collector walks
the whole heap each time a full collection comes due, and the heap keeps growing while they load: six full
collections of 25-155 ms during a run's start-up here (0.55 s), and one more at exit (0.9 s).

* :func:`importing`: while a command's heavy imports load, no collection runs, and what they loaded is then
  frozen (Python's permanent generation: never walked again), so later collections walk only what the command
  makes.
* At exit the heap is frozen after the other atexit handlers ran, and the interpreter's last collection does not
  walk it: what is not in a reference cycle is still freed as the modules are cleared, and what is in one is left
  to the operating system, as ``os._exit`` leaves everything after a multi-process run
  (``runtime.finish_process``). Everything a command writes is closed and flushed before ``main`` returns, and
  atexit handlers (logging's, trackers') still run.

Peak memory: the same for a training run; 25 MiB more for ``accel-evaluate`` (of about 880), whose imports
(evaluate, datasets, pandas) leave more behind.

Only in a process that :func:`one_command_process` marked: the Python API (``accel_train.train`` in a notebook,
called again and again) keeps the collector as it is, since an object frozen while alive is never collected when
it dies in a reference cycle later.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_ONE_COMMAND = False


def one_command_process() -> None:
    """Mark this process as running one command and exiting (``cli.run_main``); registered once per process."""
    global _ONE_COMMAND
    if not _ONE_COMMAND:
        atexit.register(gc.freeze)
        _ONE_COMMAND = True


@contextmanager
def importing() -> Iterator[None]:
    """A command's heavy imports: no collection while they load, and what they loaded frozen after.

    Imports leave almost nothing in reference cycles (a few hundred objects for torch, ``torch._dynamo`` and
    accelerate), so freezing without a collection keeps no real garbage; nothing a run builds (data, model,
    optimizer) is made inside, and those stay collectable. Nothing changes outside a
    :func:`one_command_process` or where the collector is already off. On an error the collector is switched
    back on without a freeze.
    """
    if not _ONE_COMMAND or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        gc.enable()
