"""The run directory: every file name a run writes, who may write there, and how a run is replaced.

``RunDir`` is the one owner of ``--output-dir``:

* **names**: everything a run writes is listed in :data:`OUTPUTS`; ``--overwrite``
  touches exactly these, never a user's other files;
* **refusals** before anything is loaded: filesystem roots and the home folder,
  a folder holding another run (without ``--resume``/``--overwrite``), a folder that
  is not a run but holds files a run would overwrite (a user's own ``model/``);
* **a lock** (``.lock``, ``run_lock.py``: ``flock`` plus the holder's PID and host), held by the main
  process for the life of the run, so two runs never write into one folder;
* **replacing a run is a transaction** (``--overwrite``): the previous run is moved
  into ``.replaced/`` (staged through ``.replacing/``, so a kill half-way is undone)
  and deleted only once the new run has saved its first checkpoint or finished
  (through ``.replaced-discard/``); if the new run fails before that, the previous
  run is put back (through ``.restoring/``). Every step is one rename or can be
  finished after a kill: the next run in the folder, holding the lock, completes or
  undoes what a killed one left (:meth:`RunDir.recover`). Only the lock's holder that
  staged a run ever restores it: a run refused by the lock touches nothing;
* **branching**: resuming from an older checkpoint moves the newer checkpoints, and
  everything else that describes the abandoned timeline (metrics after the branch
  point, summary, exports, confusion matrix, plots, TensorBoard), to ``abandoned/``
  (``checkpoint/branch.py`` decides what; :meth:`RunDir.set_aside` moves it);
* **restarts**: a run that starts over in a folder whose earlier attempt saved no
  checkpoint (``--resume auto``) moves that attempt's records to ``abandoned/`` too,
  so no step is ever logged twice;
* **only regular files** where a run reads or appends: a FIFO or device in the
  folder is refused before anything is opened (it would block the run forever).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

from accel_train.errors import UserError
from accel_train.fsio import WRITE_GUARD, real_path, remove_temporaries, write_text_atomic, writing
from accel_train.limits import file_kind
from accel_train.run_lock import LOCK, RunLock, pid_alive

__all__ = ["CHECKPOINT_DIR", "LOCK", "MARKER", "METRICS", "OUTPUTS", "TMP_PREFIX", "RunDir", "RunLock", "pid_alive"]

MARKER = ".accel_train_run"
REPLACED = ".replaced"  # the previous run, while its --overwrite has not saved a checkpoint
STAGING = ".replacing"  # the previous run on its way into .replaced/ (a kill here is undone)
DISCARD = ".replaced-discard"  # the previous run on its way out, once the new one saved a checkpoint
RESTORING = ".restoring"  # the failed new run being removed, before the previous run moves back
RETURNING = ".returning"  # the previous run moving back from .replaced/
ABANDONED = "abandoned"
CONFIG = "config.yaml"
DATA_FILES = "data_files.npz"  # the file list of the data the run trains on (data.identity), for a resume's diff
CHECKPOINT_DIR = "checkpoints"
TMP_PREFIX = ".tmp-"  # a checkpoint being saved: checkpoints/.tmp-step_XXXXXXXX, renamed into place when complete
#: The only folder names a run gives its checkpoints (``step_`` + 8 digits, and the ``.tmp-`` form while a save
#: is under way). Resume, retention and ``--branch`` see nothing else in ``checkpoints/``: a user's renamed copy
#: or own folder there is never resumed from, moved or deleted.
_OWN_CHECKPOINT = re.compile(r"step_\d{8,}")
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
    DATA_FILES,
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
#: Written between a Slurm job's attempts (``commands/requeue.py``): the job id and its attempts in a row without
#: progress. Not a run's output (``--overwrite`` leaves it; a new job id starts a new count).
REQUEUE_STATE = ".slurm-requeue.json"
_LEGACY_EVENTS = "events.out.tfevents.*"
#: What describes one timeline beyond its checkpoints: moved aside by --branch and by a restart.
TIMELINE = (SUMMARY, METRICS_CSV, MODEL, MODEL_EMA, CURVES, CONFUSION_JSON, CONFUSION_PNG, TENSORBOARD)
#: Outputs that are folders; every other name in OUTPUTS (and the lock) must be a regular file.
_FOLDERS = {CHECKPOINT_DIR, MODEL, MODEL_EMA, BEST, TENSORBOARD, ABANDONED, *TRACKER_FOLDERS}


def checkpoint_name(global_step: int) -> str:
    """The folder name of the checkpoint saved after ``global_step`` optimizer steps."""
    return f"step_{global_step:08d}"


def is_own_checkpoint_name(name: str) -> bool:
    return _OWN_CHECKPOINT.fullmatch(name) is not None


def _kind_problem(path: Path, folder: bool) -> str | None:
    """Why ``path`` (present) cannot be one of a run's files or folders, or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc}: a broken or looping link?)"
    if folder and not stat.S_ISDIR(mode):
        return "is not a folder"
    if not folder and not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file"
    return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _move_all(src: Path, dest: Path) -> None:
    """Move every entry of ``src`` into ``dest`` (an entry there of the same name gives way), then drop ``src``."""
    for entry in list(src.iterdir()):
        _remove(dest / entry.name)
        os.replace(entry, dest / entry.name)
    src.rmdir()


class RunDir:
    """One run folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lock = RunLock(self.path)
        self.staged = False  # this process holds the previous run in .replaced/ and may put it back

    @classmethod
    def of(cls, run: RunDir | str | os.PathLike) -> RunDir:
        """``run`` itself, or the run folder at that path."""
        return run if isinstance(run, RunDir) else cls(run)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    def checkpoint_folders(self) -> list[Path]:
        """The run's own checkpoint folders (by name, oldest first), never a ``.tmp-`` save, a link or a foreign
        folder. A save renames its folder into place only once it is complete, so each one was saved whole;
        whether its files are still readable is ``checkpoint.state``'s question."""
        root = self.checkpoints
        if not root.is_dir():
            return []
        found = [p for p in root.iterdir() if is_own_checkpoint_name(p.name) and not p.is_symlink() and p.is_dir()]
        return sorted(found, key=lambda p: p.name)

    def has_checkpoint(self) -> bool:
        return bool(self.checkpoint_folders())

    # ---- what is there -------------------------------------------------------------------------------------
    def outputs_present(self) -> list[str]:
        names = [n for n in OUTPUTS if os.path.lexists(self.path / n)]
        return names + sorted(p.name for p in self.path.glob(_LEGACY_EVENTS))

    def holds_run(self) -> bool:
        """Written by accel_train: our marker, a checkpoint with progress, a staged run, or our metrics log."""
        if (self.path / MARKER).exists() or (self.path / REPLACED).is_dir() or self.has_checkpoint():
            return True
        metrics = self.path / METRICS
        if _kind_problem(metrics, folder=False) is not None:
            return False  # absent, or not a regular file: never opened (a FIFO would block here)
        try:
            with open(metrics) as fh:
                return "event" in json.loads(fh.readline())
        except (OSError, ValueError, TypeError):
            return False

    def interrupted_replace(self) -> bool:
        """An --overwrite was stopped before its first checkpoint: the run it replaces waits in .replaced/."""
        return (self.path / REPLACED).is_dir() and not self.has_checkpoint()

    def _journal(self) -> list[str]:
        return [n for n in (STAGING, RESTORING, RETURNING, DISCARD) if os.path.lexists(self.path / n)]

    # ---- before anything is loaded -------------------------------------------------------------------------
    def check(self, resume: str, overwrite: bool) -> None:
        """Refuse an unusable --output-dir (no side effects)."""
        out = self.path
        absolute = out.expanduser().absolute()
        real = real_path(out, "--output-dir")  # a broken or looping link on the way: one line
        if real == Path(real.anchor) or real == Path.home().resolve():
            what = "a filesystem root" if real == Path(real.anchor) else "your home folder"
            raise UserError(
                f"--output-dir {out} is {what}; a run writes and replaces files there: choose a folder for this "
                "run, e.g. runs/NAME"
            )
        present = self.outputs_present() if out.is_dir() else []
        self._check_kinds(present)
        shown = ", ".join([n for n in present if n != MARKER][:4]) or MARKER
        if present and not self.holds_run():
            raise UserError(
                f"--output-dir {out} is not an accel_train run but holds {shown}, which a run would overwrite; "
                "choose a new or empty folder"
            )
        replacing = overwrite and resume == "none"
        if out.is_dir() and self.interrupted_replace() and not replacing:
            raise UserError(
                f"--output-dir {out}: an --overwrite of this folder was stopped before its first checkpoint, and the "
                f"run it replaces is kept in {out / REPLACED}; pass --overwrite to replace that run again (it is "
                f"kept until the new run saves a checkpoint), or move the contents of {out / REPLACED} back into "
                f"{out} to keep it"
            )
        if present and resume == "none" and not overwrite:
            raise UserError(
                f"--output-dir {out} already holds a run ({shown}); pass --resume auto to continue it, --overwrite "
                "to replace it, or choose another --output-dir"
            )
        self._check_writable(absolute)

    def _check_kinds(self, present: list[str]) -> None:
        """Every file a run reads or appends to is a regular file: a FIFO or a device would block it forever."""
        names = [*present, *(n for n in (LOCK, REPLACED) if os.path.lexists(self.path / n))]
        for name in names:
            problem = _kind_problem(self.path / name, folder=name in _FOLDERS or name == REPLACED)
            if problem:
                raise UserError(
                    f"--output-dir {self.path}: {self.path / name} {problem}; a run reads and writes it, so remove "
                    "or rename it, or choose another --output-dir"
                )

    def _check_writable(self, absolute: Path) -> None:
        parent = next(p for p in (absolute, *absolute.parents) if p.exists())
        if not parent.is_dir():
            what = "is a file" if parent == absolute else f"is inside {parent}, which is a file"
            raise UserError(f"--output-dir {self.path} is not writable (it {what}); choose another folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(
                f"--output-dir {self.path} is not writable (no permission on {parent}); choose another folder"
            )

    def refuse_if_locked(self) -> None:
        """A second writer is refused before it loads anything (the lock itself is taken in :meth:`prepare`)."""
        if self.lock.fd is None:  # else this run already holds it (taken to recover)
            self.lock.check_free()

    def recover_if_interrupted(self) -> list[str]:
        """Main process, before the folder is judged: a replacement a killed run left half-done is finished or
        undone now, under the lock (kept for the run). Returns notes to print; nothing to do takes no lock."""
        committed = (self / REPLACED).is_dir() and self.has_checkpoint()
        if not self.path.is_dir() or not (self._journal() or committed):
            return []
        if self.lock.fd is None:
            self.lock.acquire()
        return self.recover()

    def recover(self) -> list[str]:
        """Finish or undo each half-done step of a replacement (lock held). See the module docstring."""
        p, notes = self.path, []
        with writing(p, "the run folder"), WRITE_GUARD:
            if (p / STAGING).is_dir():  # moving the previous run aside was cut: it goes back
                _move_all(p / STAGING, p)
                notes.append(f"an interrupted --overwrite had begun to move the run in {p} aside; it is back")
            if (p / RESTORING).is_dir():  # putting the previous run back was cut while the failed run was removed
                self._remove_outputs()
                os.replace(p / RESTORING, p / RETURNING)
            if (p / RETURNING).is_dir():  # ... or while the previous run was moving back
                _move_all(p / RETURNING, p)
                notes.append(f"an interrupted restore of the run in {p} is finished: the previous run is back")
            if (p / REPLACED).is_dir() and self.has_checkpoint():  # the replacement saved a checkpoint: it stays
                os.replace(p / REPLACED, p / DISCARD)
            if os.path.lexists(p / DISCARD):
                shutil.rmtree(p / DISCARD, ignore_errors=True)
        return notes

    # ---- once every input is loaded ------------------------------------------------------------------------
    def prepare(self, overwrite: bool, restart: bool = False) -> list[str]:
        """Create the folder, lock it, stage a run being overwritten; returns notes to print (main process).

        ``restart``: a run starting over (``--resume auto`` found no checkpoint) in a folder that holds an earlier
        attempt: that attempt's records move to ``abandoned/`` so no step is logged twice.
        """
        notes = []
        with writing(self.path, "the run folder"):
            self.path.mkdir(parents=True, exist_ok=True)
            if self.lock.fd is None:
                self.lock.acquire()
            notes += self.recover()  # a killed run may have left a step half-done since check() looked
            self._remove_cut_writes()
            if self.interrupted_replace():
                if not overwrite:  # check() refused this; the folder changed since
                    raise UserError(f"{self.path / REPLACED} holds a run that an interrupted --overwrite replaces")
                self._remove_outputs()  # the interrupted attempt saved nothing; the run it replaces stays staged
                self.staged = True
                notes.append(
                    f"--overwrite: an earlier --overwrite was stopped before its first checkpoint; the run it "
                    f"replaces stays in {self.path / REPLACED} until this one saves its first checkpoint"
                )
            elif overwrite and self.outputs_present():
                self._stage()
                notes.append(
                    f"--overwrite: the previous run is kept in {self.path / REPLACED} until this one saves its "
                    "first checkpoint"
                )
            elif restart and self.set_aside(self.path / METRICS, "restart", extra=(BEST, CONFIG, *TRACKER_FOLDERS)):
                notes.append(
                    f"no checkpoint to resume from in {self.path}: starting over; the earlier attempt's records "
                    f"are in {self.path / ABANDONED}/"
                )
            (self.path / MARKER).write_text(json.dumps({"accel_train_run": 1}) + "\n")
        return notes

    def _remove_cut_writes(self) -> None:
        """What writes a kill cut left, removed before this attempt writes (lock held): atomic writes' temporaries
        (summary, exports, plots, metrics) and checkpoint folders being saved or deleted (``.tmp-step_*``)."""
        for folder, names in ((self.path, OUTPUTS), *((self.path / n, None) for n in (MODEL, MODEL_EMA, BEST))):
            remove_temporaries(folder, names)
        for stale in self.checkpoints.glob(f"{TMP_PREFIX}step_*"):
            if is_own_checkpoint_name(stale.name[len(TMP_PREFIX) :]) and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)

    def _stage(self) -> None:
        staging = self.path / STAGING
        staging.mkdir()
        for name in self.outputs_present():
            os.replace(self.path / name, staging / name)
        os.replace(staging, self.path / REPLACED)  # one rename: the previous run is staged, whole
        self.staged = True

    def _remove_outputs(self) -> None:
        for name in self.outputs_present():
            _remove(self.path / name)

    def commit_replace(self) -> None:
        """The new run has something worth keeping: forget the run it replaced."""
        if not self.staged:
            return
        with WRITE_GUARD:
            if (self.path / REPLACED).is_dir():
                os.replace(self.path / REPLACED, self.path / DISCARD)  # one rename: committed
            self.staged = False
        shutil.rmtree(self.path / DISCARD, ignore_errors=True)

    def restore_replaced(self) -> bool:
        """The new run failed before saving anything: put the previous run back. True if one was restored.

        Only the process that staged it (and holds the lock) restores: a run refused by the lock touches nothing.
        """
        staged = self.path / REPLACED
        if not self.staged or self.lock.fd is None or not staged.is_dir():
            return False
        with WRITE_GUARD:
            os.replace(staged, self.path / RESTORING)
            self._remove_outputs()
            os.replace(self.path / RESTORING, self.path / RETURNING)
            _move_all(self.path / RETURNING, self.path)
            self.staged = False
        return True

    # ---- branches (checkpoint/branch.py) and restarts --------------------------------------------------------
    def set_aside(self, log: Path, why: str, extra: tuple[str, ...] = (), keep_log: str | None = None) -> Path | None:
        """Move what describes an abandoned timeline (``TIMELINE`` + ``extra``) and its metrics log into
        ``abandoned/<time>-<why>/``; ``keep_log``: the lines the kept timeline keeps (else the log moves).
        Returns the folder, or None when there was nothing to move and nothing is kept."""
        names = [n for n in (*TIMELINE, *extra) if os.path.lexists(self.path / n)]
        recorded = log.is_file() or any(n in TIMELINE for n in names)  # a config.yaml alone recorded nothing
        if not recorded and keep_log is None:
            return None
        dest = self.path / ABANDONED / f"{time.strftime('%Y%m%d-%H%M%S')}-{why}"
        while dest.exists():
            dest = dest.with_name(dest.name + "+")
        dest.mkdir(parents=True)
        for name in names:
            os.replace(self.path / name, dest / name)
        if log.is_file() and keep_log is None:
            os.replace(log, dest / METRICS)
        elif log.is_file():
            shutil.copy2(log, dest / METRICS)  # the abandoned timeline's full log
            write_text_atomic(log, keep_log, "the metrics log")
        return dest
