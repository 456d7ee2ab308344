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


def test_the_next_attempt_removes_the_temporaries_of_writes_a_kill_cut(tmp_path):
    """A run SIGKILLed inside an atomic write (an export to best/ or model/, summary.json, a plot, a rewritten
    metrics log) leaves its hidden temporary next to the file; they stayed in the run folder for good (the kill
    campaign found best/.model.safetensors.*.tmp in finished runs). The next attempt removes them under the lock,
    before it writes; a user's own files, hidden or not, stay."""
    run = tmp_path / "run"
    for sub in ("best", "model", "model_ema"):
        (run / sub).mkdir(parents=True)
    (run / ".accel_train_run").write_text("{}")
    cut = [
        run / "best" / ".model.safetensors.k3j_h5g6.tmp",
        run / "model" / ".config.json.abcdefgh.tmp",
        run / "model_ema" / ".model.safetensors.0a1b2c3d.tmp",
        run / ".summary.json.x1y2z3w4.tmp",
        run / ".curves.png.12345.tmp",
        run / ".metrics.jsonl.qwertyui.tmp",
    ]
    mine = [run / ".notes.txt.abcdefgh.tmp", run / "notes.tmp", run / ".summary.json.bak", run / ".summary.json.tmp"]
    for path in cut + mine:
        path.write_bytes(b"partial")
    folder = RunDir(run)
    folder.prepare(overwrite=False)
    folder.lock.release()
    assert [p for p in cut if p.exists()] == []
    assert [p for p in mine if not p.exists()] == []


def test_a_retirement_cut_by_a_kill_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """--keep-last deletes the oldest checkpoint after each save. A kill half-way through that delete left the
    folder under its checkpoint name without progress.json, for good: resume skipped it and retention never saw
    it again (the kill campaign ended a run with checkpoints/step_00000060 holding model.safetensors,
    optimizer.bin and random_states_0.pkl). The folder leaves the checkpoints' names first (a .tmp- one, which
    resume ignores), and the next attempt removes it."""
    from accel_train.checkpoint import state

    class Killed(BaseException):
        pass

    root = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        folder = root / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "progress.json").write_text(json.dumps({"state": {"global_step": step}}))
        (folder / "model.safetensors").write_bytes(b"weights")

    def killed_half_way(path, ignore_errors=False):
        (path / "progress.json").unlink()  # one file deleted, then the kill
        raise Killed

    monkeypatch.setattr(state.shutil, "rmtree", killed_half_way)
    with pytest.raises(Killed):
        state._retire_old(RunDir(tmp_path), keep_last=2, keep=(root / "step_00000030",))
    monkeypatch.undo()
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000020", "step_00000030"]
    folder = RunDir(tmp_path)
    folder.prepare(overwrite=False)
    folder.lock.release()
    assert sorted(p.name for p in root.iterdir()) == ["step_00000020", "step_00000030"]
