"""The Trainer in-process on small synthetic data: step accounting, accumulation, stops, log windows, cadence.

No subprocess: these run ``accel_train.loop.fit`` (config → build → Trainer) in the test process, so
each costs about a second.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from conftest import SMALL_RUN, fit_small

from accel_train.config import parse_config


def _fit(out: Path, *args: str) -> dict:
    return fit_small(out, "--log-every", "2", *args)


def _events(out: Path, kind: str) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == kind]


def _checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").iterdir())


def test_step_accounting_with_accumulation_and_checkpoint_cadence(tmp_path):
    out = tmp_path / "run"
    summary = _fit(out, "--grad-accum-steps", "2", "--max-steps", "7", "--checkpoint-every", "3", "--keep-last", "9")
    assert summary["global_step"] == 7 and summary["accum_steps"] == 2
    assert summary["global_batch"] == 32 and summary["samples_seen"] == 7 * 32
    assert summary["epochs_completed"] == 0  # 256 samples / 32 = 8 steps per epoch: 7 is mid-epoch
    assert [e["step"] for e in _events(out, "train")] == [2, 4, 6]
    assert _checkpoint_steps(out) == [3, 6, 7]  # every 3, plus the resumable mid-epoch end
    progress = json.loads((out / "checkpoints" / "step_00000007" / "progress.json").read_text())
    assert progress["state"]["step_in_epoch"] == 7 and progress["scheduler"]["last_epoch"] == 7
    assert (out / "model" / "model.safetensors").is_file() and (out / "best" / "model.safetensors").is_file()


def test_an_epoch_is_whole_global_batches_under_accumulation(tmp_path):
    """80 samples at a global batch of 32 as 2 micro-batches of 16: an epoch is 2 optimizer steps of 32 samples (the
    16 left over wait for another epoch's order), never a third step made of the lone fifth micro-batch."""
    out = tmp_path / "run"
    summary = _fit(out, "--synthetic-size", "80", "--grad-accum-steps", "2", "--max-steps", "4")
    assert [e["step"] for e in _events(out, "epoch")] == [2, 4]  # an epoch cut to micro-batches: [3] (3 + 1 steps)
    assert summary["epochs_completed"] == 2 and summary["samples_seen"] == 4 * 32


def test_epoch_ends_evaluate_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    summary = _fit(out, "--epochs", "2")
    assert summary["global_step"] == 32 and summary["epochs_completed"] == 2  # 256 samples / 16 per step
    assert [e["step"] for e in _events(out, "eval")] == [16, 32]  # one per epoch end; the final one not twice
    assert [e["epoch"] for e in _events(out, "epoch")] == [1, 2]
    assert _checkpoint_steps(out) == [16, 32]


def test_stop_at_step_on_an_epochs_last_step_ends_that_epoch_first(tmp_path):
    """--stop-at-step N where N ends an epoch (issue 50, item 5): that epoch's evaluation, best/ and checkpoint are
    done before the stop, as an uninterrupted run does them; the resume goes on from the next epoch."""
    out = tmp_path / "run"
    summary = _fit(out, "--epochs", "2", "--stop-at-step", "16")  # 256 samples / 16 per step: 16 steps per epoch
    assert summary == {"stopped": "--stop-at-step 16", "global_step": 16, "exit_code": 0}
    assert [e["step"] for e in _events(out, "eval")] == [16] and [e["epoch"] for e in _events(out, "epoch")] == [1]
    assert _checkpoint_steps(out) == [16] and (out / "best" / "model.safetensors").is_file()
    progress = json.loads((out / "checkpoints" / "step_00000016" / "progress.json").read_text())
    assert (progress["state"]["epoch"], progress["state"]["step_in_epoch"]) == (1, 0)
    _fit(out, "--epochs", "2", "--resume", "auto")
    assert [e["step"] for e in _events(out, "eval")] == [16, 32]  # epoch 1's evaluation once, not again
    assert [e["epoch"] for e in _events(out, "epoch")] == [1, 2]


def test_stop_at_step_then_resume_logs_what_an_uninterrupted_run_logs(tmp_path):
    """The open log window travels in the checkpoint: a stop between two log steps changes no logged value."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    _fit(straight, "--max-steps", "12")
    summary = _fit(stopped, "--max-steps", "12", "--stop-at-step", "5")
    assert summary == {"stopped": "--stop-at-step 5", "global_step": 5, "exit_code": 0}
    assert _checkpoint_steps(stopped) == [5]
    _fit(stopped, "--max-steps", "12", "--resume", "auto")
    assert _events(stopped, "resume")[0]["step"] == 5
    for a, b in zip(_events(straight, "train"), _events(stopped, "train"), strict=True):
        assert a["step"] == b["step"]
        for key in ("loss", "accuracy", "lr"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)


def test_a_signal_stops_at_the_next_step_boundary(tmp_path):
    from accel_train.build import build_trainer
    from accel_train.run_dir import RunDir
    from accel_train.runtime import build_runtime

    cfg = parse_config([*SMALL_RUN, "--log-every", "2", "--output-dir", str(tmp_path / "run"), "--max-steps", "6"])
    trainer = build_trainer(cfg, build_runtime(cfg), RunDir(cfg.output_dir))
    assert trainer.stop_requested() is None
    trainer.stop_signal = signal.SIGTERM  # what the handler records
    assert trainer.stop_requested() == "received SIGTERM"
    summary = trainer.run(0.0)
    assert summary == {"stopped": "received SIGTERM", "global_step": 1, "exit_code": 143}
    assert _checkpoint_steps(tmp_path / "run") == [1]


# ---- settings the run is too short for are warnings ------------------------------------------------------------------


SMALL = [
    "--dataset", "synthetic", "--synthetic-size", "128", "--synthetic-test-size", "32",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress",
]  # fmt: skip


def test_run_length_warnings_in_a_real_run(tmp_path, capsys):
    """Needs ``build.py`` to call ``plan_warnings.warn_about_run`` once the run length is known."""
    from accel_train.loop import fit

    fit(
        parse_config(
            [*SMALL, "--max-steps", "2", "--warmup-steps", "10", "--eval-every", "5", "--output-dir", str(tmp_path)]
        )
    )
    err = capsys.readouterr().err
    assert "warning: --warmup-steps 10 is longer than the run (the run has 2 optimizer step(s))" in err, err
    assert "warning: --eval-every 5 is beyond the run" in err, err
    assert "Traceback" not in err


def _last_line(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("accel_train: eval_accuracy")][-1]


def test_a_resumed_runs_last_line_counts_this_attempt_and_the_whole_run(tmp_path, capsys):
    """After a resume (issue 50, item 5) the steps are the run's and the time was this attempt's: the line says both,
    with the run's time over its attempts carried in the checkpoints (an older checkpoint has none: said so)."""
    out = tmp_path / "run"
    _fit(out, "--max-steps", "12")
    assert " | 12 steps in " in _last_line(capsys.readouterr().out)
    assert (summary := json.loads((out / "summary.json").read_text()))["attempts"] == 1
    assert summary["total_wall_time_s"] == summary["wall_time_s"] and summary["attempt_steps"] == 12

    out = tmp_path / "resumed"
    _fit(out, "--max-steps", "12", "--stop-at-step", "5")
    saved = json.loads((out / "checkpoints" / "step_00000005" / "progress.json").read_text())["state"]["extra"]
    assert saved["attempts"] == 1 and saved["wall_time_s"] > 0
    copy = tmp_path / "older"
    shutil.copytree(out, copy)
    capsys.readouterr()
    _fit(out, "--max-steps", "12", "--resume", "auto")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["attempts"], summary["attempt_steps"], summary["global_step"]) == (2, 7, 12)
    assert summary["total_wall_time_s"] == pytest.approx(saved["wall_time_s"] + summary["wall_time_s"])
    line = _last_line(capsys.readouterr().out)
    this, total = summary["wall_time_s"], summary["total_wall_time_s"]
    assert f" | 12 steps (7 in this attempt, {this:.1f}s; {total:.1f}s over 2 attempts) | " in line, line

    progress = copy / "checkpoints" / "step_00000005" / "progress.json"  # as written before the run's time was kept
    data = json.loads(progress.read_text())
    del data["state"]["extra"]["attempts"], data["state"]["extra"]["wall_time_s"]
    progress.write_text(json.dumps(data))
    _fit(copy, "--max-steps", "12", "--resume", "auto")
    summary = json.loads((copy / "summary.json").read_text())
    assert (summary["attempts"], summary["total_wall_time_s"], summary["attempt_steps"]) == (None, None, 7)
    line = _last_line(capsys.readouterr().out)
    assert (
        f" | 12 steps (7 in this attempt, {summary['wall_time_s']:.1f}s; earlier attempts' time not recorded) | "
        in line
    )


def test_a_best_chosen_on_the_split_it_is_scored_on_says_so(tmp_path, capsys):
    """best/ is chosen by eval_accuracy on the test split, the split that reports it (issue 50, item 5): when it
    holds other weights than model/, the summary and the last lines say its accuracy is optimistic, and how to
    score it on other images."""
    out = tmp_path / "run"
    summary = _fit(out, "--max-steps", "16", "--lr", "0.01", "--eval-every", "2")
    assert summary["best_step"] != summary["global_step"]  # best/ is an earlier step's weights
    note = summary["best_note"]
    assert note.startswith(f"best/ (step {summary['best_step']}, eval_accuracy {summary['best_eval_accuracy']:.4f}) ")
    assert "test split" in note and "optimistic" in note and f"--weights {out / 'best'} --dataset" in note
    assert json.loads((out / "summary.json").read_text())["best_note"] == note
    assert f"accel_train: note: {note}" in capsys.readouterr().out.splitlines()

    only = _fit(tmp_path / "once", "--max-steps", "4")  # one evaluation: best/ is model/, nothing to say
    assert only["best_step"] == only["global_step"] and "best_note" not in only
    assert "note: best/" not in capsys.readouterr().out
