"""What a run records (in process, ``fit_small``): the step schedule it applied and checkpointed, and the epoch of
every train, eval and checkpoint record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import fit_small


def _fit(out: Path, *args: str) -> dict:
    return fit_small(out, "--synthetic-size", "64", "--synthetic-test-size", "32", *args)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]


def test_a_run_applies_and_checkpoints_its_milestones(tmp_path):
    out = tmp_path / "run"
    _fit(out, "--lr-schedule", "step", "--lr-milestones", "0.25", "--lr-gamma", "0.5", "--max-steps", "8")
    lrs = [r["lr"] for r in _records(out) if r["event"] == "train"]
    assert lrs == pytest.approx([2e-3] + [1e-3] * 7)  # after step 2 of 8 (25%): x0.5
    progress = json.loads(next((out / "checkpoints").iterdir()).joinpath("progress.json").read_text())
    assert progress["scheduler"]["lr_lambdas"][0]["milestones"] == [0.25]
    assert progress["scheduler"]["lr_lambdas"][0]["gamma"] == 0.5
    assert "lr_milestones: '0.25'" in (out / "config.yaml").read_text()


def test_train_eval_and_checkpoint_records_agree_on_the_epoch(tmp_path):
    out = tmp_path / "run"
    _fit(out, "--epochs", "2", "--eval-every", "2")  # 64 samples / 16 = 4 steps per epoch
    records = _records(out)
    labelled = [r for r in records if r["event"] in ("train", "eval", "checkpoint")]
    assert {r["event"] for r in labelled} == {"train", "eval", "checkpoint"}
    for r in labelled:
        assert r["epoch"] == (r["step"] - 1) // 4, r
    epoch_ends = [r for r in records if r["event"] == "epoch"]
    assert [(r["step"], r["epoch"]) for r in epoch_ends] == [(4, 1), (8, 2)]  # epochs completed


def test_a_step_that_ends_an_epoch_on_the_eval_every_schedule_is_evaluated_once_even_across_a_resume(tmp_path):
    """--eval-every 2 with 4 steps per epoch: steps 2, 4, 6, 8 each have one eval record (the epoch's end at step 4
    and 8 is the same model as the scheduled evaluation there), also when the run stops at step 4 right after its
    checkpoint and resumes: the evaluated step travels in progress.json."""
    out = tmp_path / "run"
    _fit(out, "--epochs", "2", "--eval-every", "2")
    steps = [r["step"] for r in _records(out) if r["event"] == "eval"]
    assert steps == [2, 4, 6, 8], steps

    resumed = tmp_path / "resumed"
    args = ("--epochs", "2", "--eval-every", "2", "--checkpoint-every", "4", "--no-checkpoint-epochs")
    _fit(resumed, *args, "--stop-at-step", "4")
    progress = json.loads((resumed / "checkpoints" / "step_00000004" / "progress.json").read_text())
    assert progress["state"]["last_eval_step"] == 4
    _fit(resumed, *args, "--resume", "auto")
    steps = [r["step"] for r in _records(resumed) if r["event"] == "eval"]
    assert steps == [2, 4, 6, 8], steps
