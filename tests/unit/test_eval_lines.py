"""The console's [eval] lines (``tracking.RunLogger``): a small folder's 2-step epochs evaluate every 2 steps, and
250 [eval] lines buried the run; the console now shows one per --log-every block of steps (beside its [train] line)
and the last, with one line saying so, while metrics.jsonl keeps every evaluation. Data whose epochs are at least
--log-every steps long shows every evaluation, as before."""

from __future__ import annotations

import json
from types import SimpleNamespace

from accel_train.tracking import RunLogger


def _run(tmp_path, capsys, epoch_steps: int, total: int, every: int, log_every: int = 10):
    logger = RunLogger(
        SimpleNamespace(is_main_process=True),
        tmp_path / "metrics.jsonl",
        total,
        0,
        progress=False,
        use_trackers=False,
        eval_lines_every=every,
    )
    for step in range(1, total + 1):
        if step % log_every == 0:
            logger.log("train", step, 0, {"loss": 1.0, "accuracy": 0.5, "lr": 0.1, "samples_per_s": 1.0})
        if step % epoch_steps == 0:
            logger.log("eval", step, step // epoch_steps - 1, {"eval_accuracy": 0.5})
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    shown = [int(line.split()[2]) for line in lines if line.startswith("[eval] ")]
    notes = [line for line in lines if line.startswith("accel_train: an evaluation every")]
    return shown, notes, [r["step"] for r in records if r["event"] == "eval"]


def test_short_epochs_show_one_eval_line_per_log_block_and_the_last(tmp_path, capsys):
    shown, notes, logged = _run(tmp_path, capsys, epoch_steps=2, total=50, every=10)
    assert shown == [2, 10, 20, 30, 40, 50]
    assert len(notes) == 1 and "every 2 step(s)" in notes[0] and "metrics.jsonl every evaluation" in notes[0]
    assert logged == list(range(2, 51, 2))  # nothing lost but console lines


def test_the_last_evaluation_is_shown_off_a_block_boundary(tmp_path, capsys):
    shown, _, logged = _run(tmp_path, capsys, epoch_steps=3, total=33, every=10)
    assert shown == [3, 12, 21, 30, 33] and logged == list(range(3, 34, 3))


def test_epochs_of_log_every_steps_or_more_show_every_evaluation(tmp_path, capsys):
    for epoch_steps in (10, 11, 15):
        (tmp_path / str(epoch_steps)).mkdir()
        shown, notes, logged = _run(tmp_path / str(epoch_steps), capsys, epoch_steps, total=60, every=10)
        assert shown == logged and not notes, epoch_steps


def test_evaluations_asked_for_by_steps_show_every_line(tmp_path, capsys):
    shown, notes, logged = _run(tmp_path, capsys, epoch_steps=2, total=20, every=1)
    assert shown == logged == list(range(2, 21, 2)) and not notes
