"""The run folder never loses a run: overwrite that can be undone, a lock, orphans, full disks, bad folders.

Each test here guards one finding of the checkpoint/run-folder integrity issue.


The in-process tests; whole runs and launches are in ../integration/test_run_folder_runs.py.
"""

from __future__ import annotations

import errno
import json
import os
import socket

import pytest

from accel_train.errors import UserError
from accel_train.run_dir import LOCK, RunDir, RunLock


def test_lock_without_flock_judges_by_pid_and_host(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    (tmp_path / LOCK).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    with pytest.raises(Exception, match="is in use by another run"):
        RunLock(tmp_path).acquire()  # a live PID on this host
    (tmp_path / LOCK).write_text(json.dumps({"pid": 2**22 + 17, "host": socket.gethostname()}))
    lock = RunLock(tmp_path)
    lock.acquire()  # dead PID: stale
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()


def test_lock_without_flock_is_never_taken_from_another_host(tmp_path, monkeypatch):
    """A run on another machine (a shared filesystem without flock) holds the folder whether or not its PID means
    anything here: a live process of this machine (this test's parent) and a PID nothing here runs, both recorded
    with another host, are both refused, by the check before a run and by taking the lock."""
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    other = socket.gethostname() + "-other"
    for pid in (os.getppid(), 2**22 + 17):  # live here, dead here: neither says anything about the other host
        record = {"pid": pid, "host": other, "started": "2024-01-01 00:00:00"}
        (tmp_path / LOCK).write_text(json.dumps(record))
        for take in (RunLock(tmp_path).check_free, RunLock(tmp_path).acquire):
            with pytest.raises(UserError, match=f"is in use by another run \\(pid {pid} on {other},"):
                take()
        assert json.loads((tmp_path / LOCK).read_text()) == record  # the holder's record is left as it was


def test_retention_never_deletes_the_saved_or_resumed_checkpoint(tmp_path):
    from accel_train.checkpoint.branch import newer_checkpoints
    from accel_train.checkpoint.state import _retire_old

    root = tmp_path / "checkpoints"
    for step in (5, 10, 20, 25):
        folder = root / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "progress.json").write_text(json.dumps({"state": {"global_step": step}}))
    resumed, saved = root / "step_00000010", root / "step_00000025"
    _retire_old(RunDir(tmp_path), keep_last=1, keep=(saved, resumed))
    assert sorted(p.name for p in root.iterdir()) == ["step_00000010", "step_00000025"]
    assert newer_checkpoints(RunDir(tmp_path), 10, resumed) == [25]  # what --branch would move aside
