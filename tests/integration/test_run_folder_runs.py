"""The run folder never loses a run: overwrite that can be undone, a lock, orphans, full disks, bad folders.

Each test here guards one finding of the checkpoint/run-folder integrity issue.


Whole runs and launches; the in-process tests are in ../unit/test_run_folder.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checks import one_error, running
from checks import run_folder_snapshot as snapshot
from conftest import FAST, REPO, check, fit_here, launch_cmd, metrics, run_here, run_script, summary
from datafiles import undecodable_png, write_image_folder

from accel_train.doctor.launching import child_env, child_pids, wait_for_step
from accel_train.run_dir import LOCK, REPLACED, RunLock

SHORT = [*FAST, "--max-steps", "12", "--checkpoint-every", "6"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A short finished run with two checkpoints, TensorBoard and plots: copied by each test."""
    out = tmp_path_factory.mktemp("run") / "run"
    args = ["--max-steps", "12", "--checkpoint-every", "6", "--keep-last", "5", "--no-progress"]  # TensorBoard, plots
    check(run_here("train.py", "--output-dir", str(out), *args))
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


def test_overwrite_that_fails_leaves_the_previous_run_intact(tmp_path, finished_run):
    """A test PNG whose pixels do not decode (its checksums are valid: the up-front image check passes it) fails
    the new run at its first evaluation, before any checkpoint: nothing is lost."""
    run = _copy(finished_run, tmp_path)
    images = write_image_folder(tmp_path / "images", with_splits=True)
    png = sorted((images / "test" / "a").glob("*.png"))[0]
    undecodable_png(png)
    before = snapshot(run)
    proc = run_here(
        "train.py", "--output-dir", str(run), "--overwrite", "--dataset", f"imagefolder:{images}",
        "--batch-size", "4", "--epochs", "1", *FAST,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "previous run in" in proc.stderr and "is restored" in proc.stderr, proc.stderr
    assert snapshot(run) == before, "the previous run must come back byte for byte"
    assert not (run / REPLACED).exists()


def test_overwrite_removes_exactly_what_a_run_wrote(tmp_path, finished_run):
    run = _copy(finished_run, tmp_path)
    (run / "notes.txt").write_text("mine\n")
    assert (run / "tb").is_dir() and (run / "confusion.json").is_file()
    old_tb = {p.name for p in (run / "tb").rglob("events.out.tfevents.*")}
    check(run_here("train.py", "--output-dir", str(run), "--overwrite", "--max-steps", "3", "--no-progress"))
    assert (run / "notes.txt").read_text() == "mine\n", "a user's own file is never touched"
    assert not (run / REPLACED).exists(), "the replaced run is deleted once the new one finished"
    assert summary(run)["global_step"] == 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003"]
    new_tb = {p.name for p in (run / "tb").rglob("events.out.tfevents.*")}
    assert len(new_tb) == 1 and not (new_tb & old_tb), "TensorBoard shows exactly one run, not two mixed"
    assert all(m["step"] <= 3 for m in metrics(run))


def test_second_writer_is_refused_and_a_stale_lock_is_not(tmp_path, finished_run):
    run = _copy(finished_run, tmp_path)
    holder = RunLock(run)
    holder.acquire()  # this test process plays the first run
    try:
        before = snapshot(run)
        proc = run_script("train.py", "--output-dir", str(run), "--resume", "auto", "--max-steps", "20", *FAST)
        one_error(proc, "is in use by another run", f"pid {os.getpid()} on {socket.gethostname()}")
        assert snapshot(run) == before
    finally:
        holder.release()
    # a lock left by a process that died (no flock held, its PID gone) does not block
    (run / LOCK).write_text(json.dumps({"pid": 2**22 + 17, "host": socket.gethostname(), "started": "then"}))
    check(run_here("train.py", "--output-dir", str(run), "--resume", "auto", "--extend", "--max-steps", "14", *FAST))
    assert summary(run)["global_step"] == 14


def test_killed_launcher_leaves_no_worker_alive(tmp_path):
    out = tmp_path / "run"
    cmd = launch_cmd("train.py", "--output-dir", str(out), "--max-steps", "5000", "--log-every", "1", *FAST,
                     config="multi_cpu.yaml")  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_step(out, 2, proc, timeout=240), proc.communicate()
        workers = child_pids(proc.pid)
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t_kill = time.time()
        deadline = time.time() + 60  # liveness: they are gone within a second; a leak is forever
        while time.time() < deadline and any(running(pid) for pid in workers):
            time.sleep(0.1)
        survivors = [pid for pid in workers if running(pid)]
        for pid in survivors:  # never leave them behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        assert not survivors, f"workers outlived their launcher by {time.time() - t_kill:.0f} s"
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    # the first rank to notice says why; its peer may instead see that rank's connection drop
    assert "the launcher (pid" in stderr and "is gone; exiting" in stderr, stderr[-3000:]


def _fault_run(out: Path, spec: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "tests" / "fault_train.py"), "--output-dir", str(out), *args]
    env = child_env({"FAULT_ENOSPC": spec})
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _fault_run(out, "checkpoint:2", *SHORT[:-2], "--max-steps", "18", "--checkpoint-every", "6")
    first = out / "checkpoints" / "step_00000006"
    one_error(proc, "cannot write checkpoint", "no space left", "free", f"previous checkpoint {first} is intact")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000006"], "no half-written folder"
    capsys.readouterr()
    fit_here("--output-dir", str(out), "--resume", "auto", "--max-steps", "18", *FAST)
    stdout = capsys.readouterr().out
    assert "resumed from" in stdout and "step_00000006" in stdout
    assert summary(out)["global_step"] == 18


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("export", "cannot write weights"), ("metrics:2", "cannot write the metrics log")],
)
def test_disk_full_during_export_or_metrics_is_one_line(tmp_path, spec, needle):
    out = tmp_path / "run"
    proc = _fault_run(out, spec, *FAST, "--max-steps", "12", "--no-checkpoint-epochs")
    one_error(proc, needle, str(out), "no space left on the device")


def test_roots_home_and_foreign_folders_are_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    one_error(run_here("train.py", "--output-dir", "/", *FAST), "is a filesystem root")
    one_error(run_here("train.py", "--output-dir", str(home), *FAST), "is your home folder")
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "model.safetensors").write_bytes(b"my own weights")
    (mine / "config.yaml").write_text("my: config\n")
    before = snapshot(mine)
    for extra in ([], ["--overwrite"]):
        proc = run_here("train.py", "--output-dir", str(mine), "--max-steps", "2", *FAST, *extra)
        one_error(proc, "is not an accel_train run", "model")
    assert snapshot(mine) == before


def test_a_killed_runs_forked_children_do_not_keep_its_lock(tmp_path):
    """DataLoader workers are forked from the main process; its lock must die with it (SIGKILL), not live on in
    the workers for the seconds they take to notice, refusing an immediate --resume auto."""
    from accel_train.run_lock import RunLock, pid_alive

    code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from accel_train.run_lock import RunLock\n"
        f"RunLock(Path({str(tmp_path)!r})).acquire()\n"
        "if os.fork() == 0:\n"
        "    print(os.getpid(), flush=True)\n"  # the child says so once its fork hooks have run, as a worker would
        "    time.sleep(60); os._exit(0)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert pid_alive(child)  # the forked child lives on, as a worker does for a few seconds
        lock = RunLock(tmp_path)
        lock.acquire()  # free at once
        lock.release()
    finally:
        os.kill(child, signal.SIGKILL)
