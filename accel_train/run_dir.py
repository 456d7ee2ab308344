"""The run directory: every file name a run writes, who may write there, and how a run is replaced.

``RunDir`` is the one owner of ``--output-dir``:

* **names**: everything a run writes is listed in :data:`OUTPUTS`; ``--overwrite``
  touches exactly these, never a user's other files;
* **refusals** before anything is loaded: filesystem roots and the home folder,
  a folder holding another run (without ``--resume``/``--overwrite``), a folder that
  is not a run but holds files a run would overwrite (a user's own ``model/``);
* **a lock** (``.lock``, ``flock`` plus the holder's PID and host), held by the main
  process for the life of the run, so two runs never write into one folder;
* **overwrite that can be undone**: the previous run is moved into ``.replaced/``
  and deleted only once the new run has saved its first checkpoint or finished;
  if the new run fails before that, the previous run is put back;
* **branching**: resuming from an older checkpoint moves the newer checkpoints
  (and their metrics) of the abandoned timeline to ``abandoned/``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from accel_train.checkpoint.state import CHECKPOINT_DIR, list_checkpoints
from accel_train.errors import UserError
from accel_train.fsio import WRITE_GUARD, writing

MARKER = ".accel_train_run"
LOCK = ".lock"
REPLACED = ".replaced"
ABANDONED = "abandoned"
CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
SUMMARY = "summary.json"
MODEL = "model"
MODEL_EMA = "model_ema"  # --ema: the averaged weights, exported beside model/
BEST = "best"
CURVES = "curves.png"
CONFUSION_JSON = "confusion.json"
CONFUSION_PNG = "confusion.png"
TENSORBOARD = "tb"
MLRUNS = "mlruns"  # --report-to mlflow without MLFLOW_TRACKING_URI
TRACKER_FOLDERS = (MLRUNS, "aim", "dvclive")  # trackers that keep local files in the run folder (tracking.py)
#: Everything a run writes at the top of its folder (TensorBoard files of older versions are matched by glob).
OUTPUTS = (
    MARKER,
    CONFIG,
    METRICS,
    METRICS_CSV,
    SUMMARY,
    CHECKPOINT_DIR,
    MODEL,
    MODEL_EMA,
    BEST,
    CURVES,
    CONFUSION_JSON,
    CONFUSION_PNG,
    TENSORBOARD,
    *TRACKER_FOLDERS,
    ABANDONED,
)
_LEGACY_EVENTS = "events.out.tfevents.*"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _logged_after(line: str, step: int) -> bool:
    try:
        return int(json.loads(line).get("step", 0)) > step
    except (ValueError, TypeError, AttributeError):
        return False


class RunLock:
    """An exclusive lock on a run folder for the life of this process.

    ``flock`` releases itself when the holder dies, however it dies; where the
    filesystem has no ``flock`` the recorded PID and host decide whether a lock
    is stale (a dead PID on this host is).
    """

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.fd: int | None = None

    def holder(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text() or "{}")
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

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
            fd = os.open(self.path, os.O_RDONLY)
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # the file stays: unlinking a flock file lets two later runs both "hold" it
            os.close(self.fd)
            self.fd = None


class RunDir:
    """One run folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lock = RunLock(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # ---- what is there -------------------------------------------------------------------------------------
    def outputs_present(self) -> list[str]:
        names = [n for n in OUTPUTS if (self.path / n).exists()]
        return names + sorted(p.name for p in self.path.glob(_LEGACY_EVENTS))

    def holds_run(self) -> bool:
        """Written by accel_train: our marker, a checkpoint with progress, or our metrics log."""
        if (self.path / MARKER).exists() or list_checkpoints(self.path):
            return True
        try:
            with open(self.path / METRICS) as fh:
                return "event" in json.loads(fh.readline())
        except (OSError, ValueError, TypeError):
            return False

    # ---- before anything is loaded -------------------------------------------------------------------------
    def check(self, resume: str, overwrite: bool) -> None:
        """Refuse an unusable --output-dir (no side effects)."""
        out = self.path
        absolute = out.expanduser().absolute()
        real = absolute.resolve()
        if real == Path(real.anchor) or real == Path.home().resolve():
            what = "a filesystem root" if real == Path(real.anchor) else "your home folder"
            raise UserError(
                f"--output-dir {out} is {what}; a run writes and replaces files there: choose a folder for this "
                "run, e.g. runs/NAME"
            )
        present = self.outputs_present() if out.is_dir() else []
        shown = ", ".join([n for n in present if n != MARKER][:4]) or MARKER
        if present and not self.holds_run():
            raise UserError(
                f"--output-dir {out} is not an accel_train run but holds {shown}, which a run would overwrite; "
                "choose a new or empty folder"
            )
        if present and resume == "none" and not overwrite:
            raise UserError(
                f"--output-dir {out} already holds a run ({shown}); pass --resume auto to continue it, --overwrite "
                "to replace it, or choose another --output-dir"
            )
        parent = next(p for p in (absolute, *absolute.parents) if p.exists())
        if not parent.is_dir():
            what = "is a file" if parent == absolute else f"is inside {parent}, which is a file"
            raise UserError(f"--output-dir {out} is not writable (it {what}); choose another folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"--output-dir {out} is not writable (no permission on {parent}); choose another folder")

    def refuse_if_locked(self) -> None:
        """A second writer is refused before it loads anything (the lock itself is taken in :meth:`prepare`)."""
        self.lock.check_free()

    # ---- once every input is loaded ------------------------------------------------------------------------
    def prepare(self, overwrite: bool) -> list[str]:
        """Create the folder, lock it, stage a run being overwritten; returns notes to print (main process)."""
        notes = []
        with writing(self.path, "the run folder"):
            self.path.mkdir(parents=True, exist_ok=True)
            if self.lock.fd is None:
                self.lock.acquire()
            if (self.path / REPLACED).exists():
                if overwrite:
                    shutil.rmtree(self.path / REPLACED)
                else:
                    notes.append(
                        f"{self.path / REPLACED} holds a run that an interrupted --overwrite was replacing; move "
                        "its contents back to restore it, or delete it"
                    )
            present = self.outputs_present()
            if overwrite and present:
                staged = self.path / REPLACED
                staged.mkdir()
                for name in present:
                    os.replace(self.path / name, staged / name)
                notes.append(
                    f"--overwrite: the previous run is kept in {staged} until this one saves its first checkpoint"
                )
            (self.path / MARKER).write_text(json.dumps({"accel_train_run": 1}) + "\n")
        return notes

    def commit_replace(self) -> None:
        """The new run has something worth keeping: forget the run it replaced."""
        shutil.rmtree(self.path / REPLACED, ignore_errors=True)

    def restore_replaced(self) -> bool:
        """The new run failed before saving anything: put the previous run back. True if one was restored."""
        staged = self.path / REPLACED
        if not staged.is_dir():
            return False
        with WRITE_GUARD:
            for name in self.outputs_present():
                target = self.path / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            for entry in staged.iterdir():
                os.replace(entry, self.path / entry.name)
            staged.rmdir()
        return True

    def abandon_after(self, step: int, keep: Path) -> Path | None:
        """Move checkpoints at or after ``step`` (except ``keep``) and their metrics to ``abandoned/``."""
        newer = [p for s, p in list_checkpoints(self.path) if s >= step and p.resolve() != keep.resolve()]
        if not newer:
            return None
        dest = self.path / ABANDONED / f"{time.strftime('%Y%m%d-%H%M%S')}-after-step_{step}"
        (dest / CHECKPOINT_DIR).mkdir(parents=True)
        for p in newer:
            os.replace(p, dest / CHECKPOINT_DIR / p.name)
        metrics = self.path / METRICS
        if metrics.exists():
            kept = [line for line in metrics.read_text().splitlines(keepends=True) if not _logged_after(line, step)]
            shutil.copy2(metrics, dest / METRICS)  # the abandoned timeline's full log
            metrics.write_text("".join(kept))
        return dest

    def newer_checkpoints(self, step: int, keep: Path) -> list[int]:
        return [s for s, p in list_checkpoints(self.path) if s >= step and p.resolve() != keep.resolve()]
