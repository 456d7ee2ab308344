"""Records what a non-main rank writes under a folder (tests/integration/test_promises_runs.py: only rank 0
writes run files).

Put on PYTHONPATH of a launched run with ``ACCEL_TRAIN_AUDIT_ROOT`` (the folder) and ``ACCEL_TRAIN_AUDIT_LOG``
(a path prefix): every process whose ``RANK`` is set and not 0 appends one line per write-like event under the
root to ``<log>.rank<N>``, through Python's audit hooks (PEP 578): opens for writing, renames, mkdir, remove,
rmdir, rmtree, truncate, symlink. Native writers (torch.save, safetensors) that write directly are not seen;
accel_train writes through a temporary file and a rename, which is.
"""

import os
import sys

_root = os.environ.get("ACCEL_TRAIN_AUDIT_ROOT")
_rank = os.environ.get("RANK")
if _root and _rank not in (None, "0"):
    _root = os.path.realpath(_root)
    _log = open(f"{os.environ['ACCEL_TRAIN_AUDIT_LOG']}.rank{_rank}", "a", buffering=1)  # noqa: SIM115
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def _under_root(path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            return os.path.realpath(os.fsdecode(path)).startswith(_root)
        except (TypeError, ValueError):
            return False

    def _hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & _WRITE)
            paths = [path] if writes else []
        elif event in ("os.rename", "os.link", "os.symlink"):
            paths = list(args[:2])
        elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate", "os.chmod"):
            paths = [args[0]]
        else:
            return
        for p in paths:
            if _under_root(p):
                _log.write(f"{event} {os.fsdecode(p)}\n")

    sys.addaudithook(_hook)
