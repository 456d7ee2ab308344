"""accel_train/commands/requeue.py: what scripts/slurm/train.sbatch asks at a time limit. The job requeues while its
attempts make progress (a checkpoint past the step the attempt started from) and stops after MAX_STALLED_REQUEUES
attempts in a row without one, or after MAX_REQUEUES restarts when that cap is set; the count of attempts without
progress survives the requeue in the run folder, per job. The real Slurm runs are in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checks import raises_user_error

from accel_train.commands import requeue
from accel_train.commands.requeue import decide
from accel_train.run_dir import REQUEUE_STATE, checkpoint_name


def _decide(**kw):
    args = {"start_step": 0, "step": 0, "stalled_before": 0, "restarts": 0, "max_stalled": 2, "max_requeues": None}
    return decide(**{**args, **kw})


def test_an_attempt_that_progressed_requeues_however_many_restarts_came_before():
    """Issue 42: a 48-hour run under a 4-hour limit; no restart count ends a run that is still progressing."""
    d = _decide(start_step=2000, step=2400, restarts=11, stalled_before=1)
    assert (d.requeue, d.stalled) == (True, 0)  # progress resets the count
    assert "from step 2000 to 2400" in d.line


@pytest.mark.parametrize(
    ("stalled_before", "max_stalled", "requeue"),
    [(0, 2, True), (1, 2, False), (0, 1, False), (2, 4, True), (3, 4, False)],
)
def test_attempts_without_progress_end_the_job_after_max_stalled_in_a_row(stalled_before, max_stalled, requeue):
    d = _decide(start_step=300, step=300, stalled_before=stalled_before, max_stalled=max_stalled)
    assert (d.requeue, d.stalled) == (requeue, stalled_before + 1)
    assert f"MAX_STALLED_REQUEUES={max_stalled}" in d.line and "\n" not in d.line
    if requeue:
        assert d.line.startswith(f"no progress past step 300 ({stalled_before + 1} attempt(s) in a row"), d.line
    else:
        stop = f"not requeued: {stalled_before + 1} attempt(s) in a row saved no checkpoint past step 300"
        assert d.line.startswith(stop), d.line


def test_max_requeues_is_an_absolute_cap_when_set():
    d = _decide(start_step=0, step=50, restarts=3, max_requeues=3)
    assert not d.requeue and "3 restart(s) of MAX_REQUEUES=3 spent" in d.line and "from step 0 to 50" in d.line
    assert _decide(start_step=0, step=50, restarts=2, max_requeues=3).requeue


def test_a_step_that_went_back_is_no_progress():
    """A checkpoint deleted by hand between attempts: the run is behind where the attempt began."""
    assert _decide(start_step=40, step=20).stalled == 1


def _checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints" / checkpoint_name(step)
    folder.mkdir(parents=True)
    (folder / "progress.json").write_text(json.dumps({"state": {"global_step": step}}))


def test_the_step_is_the_latest_complete_checkpoint_of_the_folder_train_py_writes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "my runs" / "a"
    assert requeue.main(["step", "--", "--output-dir", str(run)]) == 0  # no folder yet
    assert capsys.readouterr().out == "0\n"
    _checkpoint(run, 20)
    _checkpoint(run, 40)
    (run / "checkpoints" / ".tmp-step_00000060").mkdir()  # a save cut short: not progress
    (run / "checkpoints" / checkpoint_name(80)).mkdir()  # no progress.json: incomplete
    assert requeue.main(["step", "--", "--max-steps", "90", f"--output-dir={run}", "--log-every", "10"]) == 0
    assert capsys.readouterr().out == "40\n"
    # the folder a --config file names, unless a flag overrides it; else train.py's default, from the submit folder
    config = tmp_path / "c.yaml"
    config.write_text(f"output_dir: {json.dumps(str(run))}\nmax_steps: 90\n")
    assert requeue.run_folder(["--config", str(config)]).path == run
    assert requeue.run_folder(["--config", str(config), "--output-dir", "x"]).path == Path("x")
    monkeypatch.chdir(tmp_path)
    assert requeue.run_folder([]).path == Path("runs/default")


def test_bad_train_arguments_are_one_line():
    raises_user_error(lambda: requeue.run_folder(["--max-steps", "abc"]), "--max-steps")
    raises_user_error(lambda: requeue.run_folder(["--config", "/nonexistent.yaml"]), "--config")


def _decide_cli(run: Path, job: str, start: int, *more: str) -> list[str]:
    args = ["decide", "--job", job, "--start-step", str(start), *more, "--", "--output-dir", str(run)]
    return args


def test_the_count_survives_the_requeue_per_job_and_two_stalls_end_the_job(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run, 20)
    assert requeue.main(_decide_cli(run, "7", 0)) == 0  # 0 -> 20: requeue
    assert "from step 0 to 20: requeueing job 7 (restart 1)" in capsys.readouterr().out
    assert requeue.main(_decide_cli(run, "7", 20, "--restarts", "1")) == 0  # no progress, once
    assert "1 attempt(s) in a row" in capsys.readouterr().out
    assert json.loads((run / REQUEUE_STATE).read_text()) == {"job": "7", "stalled": 1, "step": 20}
    assert requeue.main(_decide_cli(run, "8", 20)) == 0  # another job: its own count
    capsys.readouterr()
    assert requeue.main(_decide_cli(run, "8", 20, "--restarts", "1")) == 1  # twice in a row: the job ends
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "not requeued: 2 attempt(s) in a row saved no checkpoint past step 20" in out[0]
    # a count of 1, then progress, then no progress: 1 again, not 2
    assert requeue.main(_decide_cli(run, "9", 20)) == 0
    _checkpoint(run, 40)
    assert requeue.main(_decide_cli(run, "9", 20)) == 0
    assert requeue.main(_decide_cli(run, "9", 40, "--max-stalled", "2")) == 0
    assert json.loads((run / REQUEUE_STATE).read_text())["stalled"] == 1


def test_an_attempt_stopped_before_the_run_made_its_folder_is_counted_too(tmp_path, capsys):
    run = tmp_path / "never" / "made"
    assert requeue.main(_decide_cli(run, "3", 0)) == 0
    assert requeue.main(_decide_cli(run, "3", 0)) == 1
    assert "not requeued" in capsys.readouterr().out
    assert sorted(p.name for p in run.iterdir()) == [REQUEUE_STATE]  # no output of a run: train.py accepts the folder
