"""The lock on a run folder: ``flock`` on ``OUTPUT_DIR/.lock`` plus the holder's PID and host.

Held by the main process for the life of a run, so two runs never write into one folder (see
``accel_train.run_dir``, its one user).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from accel_train.errors import UserError
from accel_train.limits import file_kind

LOCK = ".lock"
# The lock files this process holds open. A forked child (a DataLoader worker) would share their open file
# description, and flock is released only when every descriptor of it is closed: after a SIGKILL of the main
# process its workers held the run for seconds more, refusing an immediate --resume auto. Children close them.
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive lock on a run folder for the life of this process.

    ``flock`` releases itself when the holder dies, however it dies; where the
    filesystem has no ``flock`` the recorded PID and host decide whether a lock
    is stale (a dead PID on this host is).
    """

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.fd: int | None = None

    def _open(self, flags: int) -> int:
        """Open the lock file without ever blocking (a FIFO would): only a regular file is a lock."""
        fd = os.open(self.path, flags | os.O_NONBLOCK, 0o644)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise UserError(
                f"--output-dir {self.path.parent}: {self.path} is {file_kind(mode)}, not a regular file, so it cannot "
                "lock the run folder; remove it, or choose another --output-dir"
            )
        return fd

    def holder(self) -> dict[str, Any]:
        try:
            fd = self._open(os.O_RDONLY)
        except (OSError, UserError):
            return {}
        try:
            data = json.loads(os.read(fd, 4096).decode(errors="replace") or "{}")
            return data if isinstance(data, dict) else {}
        except ValueError:
            return {}
        finally:
            os.close(fd)

    def _busy(self, info: dict[str, Any]) -> UserError:
        who = f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {info.get('started', '?')}"
        return UserError(
            f"--output-dir {self.path.parent} is in use by another run ({who}); wait for it to finish or stop it, "
            f"or choose another --output-dir (if that run is gone, delete {self.path})"
        )

    def check_free(self) -> None:
        """Refuse now if another live run holds the lock; takes nothing and changes no file."""
        import fcntl

        try:
            fd = self._open(os.O_RDONLY)
        except OSError:
            return  # no lock file (or unreadable): nothing to check yet; acquire() decides
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise self._busy(self.holder()) from None
        except OSError:
            self._judge_by_pid(self.holder())
        finally:
            os.close(fd)

    def _judge_by_pid(self, info: dict[str, Any]) -> None:
        """No flock on this filesystem: a recorded live PID on this host, or any other host's, holds it."""
        mine = info.get("host") == socket.gethostname()
        pid = info.get("pid")
        if isinstance(pid, int) and pid > 0 and (not mine or pid_alive(pid)):
            raise self._busy(info)

    def acquire(self) -> None:
        import fcntl

        info = self.holder()
        fd = self._open(os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._busy(info) from None
        except OSError:
            try:
                self._judge_by_pid(info)
            except UserError:
                os.close(fd)
                raise
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self.fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # the file stays: unlinking a flock file lets two later runs both "hold" it
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None
