"""A run is never lost and never mixed with another (issue 24): real kills, real races, real FIFOs, a real full disk.

Each test names the finding it guards. The kills are real SIGKILLs of real training processes at the moment the
finding needs (``.replaced`` has appeared, a step is logged, the branch is made); the race is two real processes;
the full disk is a real tmpfs (skipped, with the reason, where this machine cannot mount one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from checks import one_error
from checks import run_folder_snapshot as snapshot
from conftest import FAST, REPO, SMALL_RUN, check, fit_here, launch_cmd, metrics, run_here, run_script, summary
from datafiles import undecodable_png, write_image_folder

from accel_train.doctor.launching import child_env
from accel_train.run_dir import DISCARD, REPLACED, RESTORING, RETURNING, STAGING, RunDir

FIVE = [*SMALL_RUN, "--max-steps", "5", "--checkpoint-every", "5"]
NO_CHECKPOINT = ["--max-steps", "400", "--checkpoint-every", "1000", "--no-checkpoint-epochs"]  # runs to be killed


def _train(out: Path, *args: str) -> None:
    check(run_here("train.py", *FIVE, "--output-dir", str(out), *args))


def _start(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = launch_cmd("train.py", *SMALL_RUN, "--output-dir", str(out), *args)
    env = child_env(env)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 240) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (polled every 5 ms); fail if it ended first."""
    deadline = time.time() + timeout
    try:
        while not ready():
            assert proc.poll() is None, f"the run ended before the moment to kill it:\n{proc.communicate()[1][-3000:]}"
            assert time.time() < deadline, "the moment to kill never came"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()


def _failing_images(tmp_path: Path) -> Path:
    """An image folder whose one test image passes the up-front scan but fails to decode: a run on it fails at its
    first evaluation, before any checkpoint."""
    images = write_image_folder(tmp_path / "images", with_splits=True)
    undecodable_png(sorted((images / "test" / "a").glob("*.png"))[0])
    return images


def _steps(events: list[dict], kind: str = "train") -> list[int]:
    return [e["step"] for e in events if e["event"] == kind]


# ---- finding 1: a killed --overwrite, then a failing --overwrite ---------------------------------------------
def test_killed_then_failing_overwrite_keeps_the_original_run(tmp_path):
    run = tmp_path / "R"
    _train(run)
    before = snapshot(run)
    _kill_when(_start(run, "--overwrite", *NO_CHECKPOINT), lambda: (run / REPLACED).is_dir())
    assert (run / REPLACED).is_dir(), "the kill came after the run it replaces was staged"
    images = _failing_images(tmp_path)
    proc = run_here(
        "train.py", "--output-dir", str(run), "--overwrite", "--dataset", f"imagefolder:{images}",
        "--batch-size", "4", "--epochs", "1", *FAST,
    )  # fmt: skip
    assert proc.returncode != 0 and "previous run in" in proc.stderr and "is restored" in proc.stderr, proc.stderr
    assert snapshot(run) == before, "the original run comes back byte for byte"
    assert not (run / REPLACED).exists()


def test_after_a_killed_overwrite_a_plain_run_is_refused_and_touches_nothing(tmp_path):
    run = tmp_path / "R"
    _train(run)
    _kill_when(_start(run, "--overwrite", *NO_CHECKPOINT), lambda: (run / REPLACED).is_dir())
    before = snapshot(run)
    for extra in (["--resume", "auto"], []):
        proc = run_here("train.py", *FIVE, "--output-dir", str(run), *extra)
        one_error(proc, "was stopped before its first checkpoint", str(run / REPLACED), "--overwrite")
    assert snapshot(run) == before
    # and a second --overwrite that succeeds replaces it for good
    check(run_here("train.py", *FIVE, "--output-dir", str(run), "--overwrite", "--max-steps", "3"))
    assert summary(run)["global_step"] == 3 and not (run / REPLACED).exists()


# ---- finding 2: two --overwrite runs started at once ---------------------------------------------------------
# LeNet whose training forward waits for the file $GATE: the run that wins the folder holds it at its first step.
GATED_MODEL = """
import os, time
from accel_train.models.lenet import LeNet

class GatedLeNet(LeNet):
    def forward(self, x):
        if self.training and not os.path.exists(os.environ["GATE"]):
            open(f"{os.environ['GATE']}.waiting.{os.getpid()}", "w").close()  # this run holds the folder
        while self.training and not os.path.exists(os.environ["GATE"]):
            time.sleep(0.01)
        return super().forward(x)
"""


def test_two_overwrite_runs_at_once_leave_one_whole_run(tmp_path):
    """Both start at once and race for the folder; the winner waits at its first step until the loser has been
    refused, so the two always overlap (without the gate, a winner that finished before the loser looked, on a
    busy machine, let the loser replace it legitimately: a flaky test, not a finding)."""
    run, models, gate = tmp_path / "R", tmp_path / "models", tmp_path / "gate"
    _train(run, "--max-steps", "4")
    models.mkdir()
    (models / "gated_lenet.py").write_text(GATED_MODEL)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(models)]), "GATE": str(gate)}
    args = ("--overwrite", "--checkpoint-every", "100", "--model", "gated_lenet:GatedLeNet")
    procs = [_start(run, *args, "--max-steps", str(n), env=env) for n in (30, 40)]
    deadline = time.time() + 300
    try:
        while all(p.poll() is None for p in procs):  # one of them is refused while the other waits at the gate
            assert len(list(tmp_path.glob("gate.waiting.*"))) < 2, "both runs passed the lock: one folder, two runs"
            assert time.time() < deadline, "neither run ended, and neither was refused"
            time.sleep(0.05)
    except AssertionError:
        for p in procs:  # both wait at the gate: end them with the test
            p.kill()
            p.communicate()
        raise
    gate.write_text("")
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [(c, err[-1500:]) for c, _, err in results]
    loser = next(err for code, _, err in results if code == 2)
    assert "in use by another run" in loser and "restored" not in loser, loser
    winner_steps = summary(run)["global_step"]
    assert winner_steps in (30, 40)
    saved = (run / "config.yaml").read_text()
    assert f"max_steps: {winner_steps}\n" in saved, "config.yaml and summary.json describe the same run"
    events = metrics(run)
    assert _steps(events) == list(range(1, winner_steps + 1)), "metrics.jsonl holds the winner's steps, once"
    assert not (run / REPLACED).exists()


# ---- a kill at every step of a replacement: the next run finishes or undoes it -------------------------------
@pytest.mark.parametrize("cut", ["staging", "restoring", "returning", "discard", "checkpoint_not_committed"])
def test_a_kill_at_any_step_of_a_replacement_is_finished_or_undone(tmp_path, cut):
    run = tmp_path / "R"
    _train(run)
    original = snapshot(run)
    names = sorted(p.name for p in run.iterdir() if p.name != ".lock")
    if cut == "staging":  # killed while the previous run moved into .replacing/: half of it there
        _move(run, names[: len(names) // 2], run / STAGING)
    elif cut == "restoring":  # a failed replacement was being removed: the previous run whole in .restoring/
        _move(run, names, run / RESTORING)
        (run / "summary.json").write_text('{"global_step": 999}')  # what is left of the failed run
        (run / "tb").mkdir()
    elif cut == "returning":  # ... and then moving back: half of it back at the top
        _move(run, names[: len(names) // 2], run / RETURNING)
    elif cut == "discard":  # killed while the replaced run was being deleted: the new run is kept
        (run / DISCARD).mkdir()
        (run / DISCARD / "old.txt").write_text("old")
    elif cut == "checkpoint_not_committed":  # the new run saved a checkpoint; the kill came before the commit
        (run / REPLACED).mkdir()
        (run / REPLACED / "summary.json").write_text('{"global_step": 1}')
    proc = run_here("train.py", *FIVE, "--output-dir", str(run), "--resume", "auto")
    check(proc)
    assert not any((run / n).exists() for n in (STAGING, RESTORING, RETURNING, DISCARD, REPLACED)), sorted(
        p.name for p in run.iterdir()
    )
    if cut in ("staging", "restoring", "returning"):
        assert "accel_train: an interrupted" in proc.stdout, proc.stdout
        # the previous run is whole again (and the resume found it already finished: nothing was written)
        assert snapshot(run) == original
    assert not (run / "tb").exists() and summary(run)["global_step"] == 5


def _move(run: Path, names: list[str], into: Path) -> None:
    into.mkdir()
    for name in names:
        os.replace(run / name, into / name)


# ---- finding 4: retention deletes only what the run wrote ----------------------------------------------------
def test_keep_last_never_deletes_a_users_folder_inside_checkpoints(tmp_path):
    run = tmp_path / "R"
    _train(run)
    ckpts = run / "checkpoints"
    mine = ckpts / "before_the_lr_change"  # a renamed copy of a real checkpoint, with the user's notes
    shutil.copytree(ckpts / "step_00000005", mine)
    (mine / "notes.txt").write_text("keep this one\n")
    (ckpts / ".tmp-notes").mkdir()  # looks like a leftover of a killed save, but the run never names one so
    (ckpts / ".tmp-notes" / "todo.txt").write_text("mine\n")
    before = {**snapshot(mine), **{f".tmp/{k}": v for k, v in snapshot(ckpts / ".tmp-notes").items()}}
    check(run_here("train.py", *FIVE, "--output-dir", str(run), "--resume", "auto", "--extend", "--max-steps",
                   "15", "--keep-last", "1"))  # fmt: skip
    assert sorted(p.name for p in ckpts.iterdir()) == [".tmp-notes", "before_the_lr_change", "step_00000015"]
    after = {**snapshot(mine), **{f".tmp/{k}": v for k, v in snapshot(ckpts / ".tmp-notes").items()}}
    assert after == before


# ---- finding 5: --branch, then a kill before the next checkpoint ---------------------------------------------
def test_branch_then_kill_leaves_nothing_of_the_abandoned_timeline_at_the_top(tmp_path, monkeypatch):
    """The branch's run hangs in its first step (hang_lenet, FAULT_CALL=1) and is SIGKILLed there: whenever the
    kill lands, no step of the new timeline has been trained (a loaded machine once let step 11 through)."""
    import fault_train  # noqa: F401  (registers hang_lenet, which without FAULT_CALL is LeNet)

    monkeypatch.delenv("FAULT_CALL", raising=False)
    run, hang = tmp_path / "R", [*SMALL_RUN, "--model", "hang_lenet"]
    check(run_here("train.py", *hang, "--output-dir", str(run), "--max-steps", "30", "--checkpoint-every", "10",
                   "--no-checkpoint-epochs", "--keep-last", "5", "--eval-every", "10", "--plots"))  # fmt: skip
    assert all((run / n).exists() for n in ("summary.json", "model", "confusion.json", "best", "curves.png"))
    old_summary = (run / "summary.json").read_bytes()
    branch = run / "checkpoints" / "step_00000010"
    cmd = launch_cmd("tests/fault_train.py", *hang, "--output-dir", str(run), "--resume", str(branch), "--branch",
                     "--extend", *NO_CHECKPOINT)  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env({"FAULT_CALL": "1"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    _kill_when(proc, lambda: any(e.get("event") == "resume" for e in _events(run)))
    top = sorted(p.name for p in run.iterdir())
    for stale in ("summary.json", "model", "confusion.json", "confusion.png", "curves.png"):
        assert stale not in top, f"{stale} of the abandoned timeline is still read as current: {top}"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000010"]
    [dest] = list((run / "abandoned").iterdir())
    assert (dest / "summary.json").read_bytes() == old_summary
    assert sorted(p.name for p in (dest / "checkpoints").iterdir()) == ["step_00000020", "step_00000030"]
    assert all(e["step"] <= 10 for e in _events(run) if e["event"] != "resume")
    # best/: kept only if the abandoned timeline never beat the branch point's best
    progress = json.loads((branch / "progress.json").read_text())["state"]
    beat = any(e["eval_accuracy"] > (progress["best_metric"] or -1) for e in _events(dest) if e["event"] == "eval"
               and e["step"] > 10)  # fmt: skip
    assert (run / "best").exists() != beat and (dest / "best").exists() == beat


def _events(run: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


# ---- finding 6: a kill before the first checkpoint, then --resume auto ---------------------------------------
def test_restart_after_a_kill_before_the_first_checkpoint_logs_no_step_twice(tmp_path, capsys):
    run = tmp_path / "R"
    proc = _start(run, *NO_CHECKPOINT)
    _kill_when(proc, lambda: _steps(_events(run))[-1:] >= [5])
    first = _events(run)
    assert _steps(first)[:5] == [1, 2, 3, 4, 5] and not (run / "checkpoints").exists()
    fit_here(*SMALL_RUN, "--output-dir", str(run), "--resume", "auto", "--max-steps", "8")
    out = capsys.readouterr().out
    assert "no checkpoint to resume from" in out and "starting over" in out, out
    steps = _steps(metrics(run))
    assert steps == list(range(1, 9)), f"each step logged once: {steps}"
    [dest] = list((run / "abandoned").iterdir())
    assert _steps(_events(dest)) == _steps(first), "the killed attempt's records are kept aside, whole"


# ---- FIFOs never hang a run ------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["fresh", "resume", "lock"])
def test_a_fifo_in_the_run_folder_is_one_line_not_a_hang(tmp_path, where):
    run = tmp_path / "R"
    if where == "fresh":
        run.mkdir()
        os.mkfifo(run / "metrics.jsonl")
        args = ["--output-dir", str(run), *FIVE]
    else:
        _train(run)
        name = "metrics.jsonl" if where == "resume" else ".lock"
        (run / name).unlink()
        os.mkfifo(run / name)
        args = [*FIVE, "--output-dir", str(run), "--resume", "auto", "--extend", "--max-steps", "8"]
    before = snapshot(run)
    proc = run_script("train.py", *args, timeout=120)  # a hang fails here, as a timeout
    assert str(run) in one_error(proc, "FIFO")
    assert snapshot(run) == before
    assert stat.S_ISFIFO(os.stat(run / ("metrics.jsonl" if where != "lock" else ".lock")).st_mode)


def test_append_line_refuses_a_fifo_without_blocking(tmp_path):
    from accel_train.errors import UserError
    from accel_train.fsio import append_line

    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def append() -> None:
        try:
            append_line(fifo, "{}", "the metrics log")
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            raised.append(exc)

    worker = threading.Thread(target=append, daemon=True)  # a hang stays in this thread, the test fails
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "append_line blocked on a FIFO"
    assert len(raised) == 1 and isinstance(raised[0], UserError), raised
    assert "cannot write the metrics log" in str(raised[0])


# ---- --output-dir that cannot be resolved ------------------------------------------------------------------------
def test_output_dir_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    before = snapshot(tmp_path)
    for out in (tmp_path / "a", tmp_path / "a" / "run"):
        one_error(run_here("train.py", *FIVE, "--output-dir", str(out)), str(out))
    assert snapshot(tmp_path) == before


# ---- a real full disk ----------------------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path):
    """A real 3 MiB tmpfs (root and mount(8) needed; skipped with the reason otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_real_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_good_one(tmpfs):
    """LeNet's checkpoints are ~1 MB: the second or third fills 3 MiB inside torch's zip writer ("unexpected pos",
    no errno), which the old patterns did not know. A real process, a real tmpfs."""
    out = tmpfs / "run"
    proc = run_script("train.py", "--output-dir", str(out), "--max-steps", "40", "--checkpoint-every", "5",
                      "--keep-last", "100", *FAST)  # fmt: skip
    line = one_error(proc, "cannot write checkpoint", "no space left on the device", "is intact")
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts and all(n.startswith("step_") for n in ckpts), f"half-written folders left: {ckpts}"
    assert f"previous checkpoint {out / 'checkpoints' / ckpts[-1]} is intact" in line
    # room again: the run resumes from the last good checkpoint and finishes
    subprocess.run(["mount", "-o", "remount,size=64m", str(tmpfs)], check=True)
    check(run_here("train.py", "--output-dir", str(out), "--resume", "auto", "--max-steps", "40", "--keep-last",
                   "1", *FAST))  # fmt: skip
    assert summary(out)["global_step"] == 40


@pytest.mark.parametrize("fill_to", [0.25, 0.55, 0.85])
def test_a_real_full_disk_anywhere_in_a_run_is_one_line(tmpfs, fill_to):
    """The disk fills at different moments of a default run (TensorBoard, plots, exports, metrics; three ~1.5 MB
    checkpoints never fit): wherever it happens, one line and exit 2, never a traceback."""
    ballast = tmpfs / "ballast"
    free = shutil.disk_usage(tmpfs).free
    ballast.write_bytes(b"\0" * int(free * fill_to))
    out = tmpfs / "run"
    proc = run_script("train.py", "--output-dir", str(out), "--max-steps", "30", "--checkpoint-every", "10",
                      "--eval-every", "10", "--no-progress")  # fmt: skip
    one_error(proc, "no space left on the device")
    if (out / "checkpoints").is_dir():
        assert all(p.name.startswith("step_") for p in (out / "checkpoints").iterdir())


def test_a_full_disk_while_config_yaml_is_rewritten_keeps_the_old_one_whole(tmpfs):
    """A resume rewrites config.yaml; a disk that fills (or a kill) during the write leaves the old file whole,
    never a truncated one (it was a plain write_text). A real tmpfs, filled to the last byte."""
    from accel_train.config import TrainConfig, save_config
    from accel_train.errors import UserError

    path = tmpfs / "config.yaml"
    save_config(TrainConfig(), path, extra={"note": "the first attempt"})
    before = path.read_bytes()
    with open(tmpfs / "ballast", "wb", buffering=0) as fh:  # fill every block
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
    with pytest.raises(UserError, match="no space left"):
        save_config(TrainConfig(), path, extra={"note": "x" * 200_000})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmpfs.iterdir()) == ["ballast", "config.yaml"]  # no temporary left


# ---- environment variables accelerate reads --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("ACCELERATE_MIXED_PRECISION", "bogus", "choose one of no, fp16, bf16"),
        ("ACCELERATE_MIXED_PRECISION", "fp8", "not fp8"),
        ("ACCELERATE_USE_CPU", "maybe", "true or false"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "two", "whole number"),
        ("ACCELERATE_DYNAMO_BACKEND", "turbo", "inductor"),
        ("ACCELERATE_TORCH_DEVICE", "gpu0", "torch device"),
    ],
)
def test_bad_accelerate_environment_is_one_line(tmp_path, monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    one_error(run_here("train.py", *FIVE, "--output-dir", str(out)), name, repr(value), needle)
    assert not out.exists()


def test_bad_accelerate_environment_is_one_line_in_a_real_process(tmp_path):
    env = {"ACCELERATE_MIXED_PRECISION": "fp8"}
    proc = run_script("train.py", *FIVE, "--output-dir", str(tmp_path / "run"), env=env)
    one_error(proc, "ACCELERATE_MIXED_PRECISION", "not fp8")


def test_precision_from_the_environment_is_what_runs_and_what_is_recorded(tmp_path, monkeypatch):
    """``BF16`` in capitals: accelerate trained in fp32 and recorded "BF16"; now bf16 runs and is recorded."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    out = tmp_path / "run"
    _train(out)
    assert summary(out)["mixed_precision"] == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    _train(tmp_path / "fp32")
    assert summary(tmp_path / "fp32")["mixed_precision"] == "no"
    from conftest import max_abs_diff, weights

    assert max_abs_diff(weights(out), weights(tmp_path / "fp32")) > 0, "bf16 really ran: the weights differ"


def test_run_dir_restore_is_only_for_the_process_that_staged(tmp_path):
    """The loser of a race holds no lock and staged nothing: restore_replaced() must not move a thing."""
    run = tmp_path / "R"
    _train(run)
    winner = RunDir(run)
    winner.prepare(overwrite=True)
    before = snapshot(run)
    loser = RunDir(run)
    assert loser.restore_replaced() is False
    loser.staged = True  # even a confused caller: without the lock, nothing moves
    assert loser.restore_replaced() is False
    assert snapshot(run) == before
    assert winner.restore_replaced() is True
    winner.lock.release()
    assert not (run / REPLACED).exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-p", "no:xdist", "-q"]))
