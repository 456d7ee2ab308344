"""Issue 44: a first run on the user's own folder learns the task with the defaults chosen for it, a run that only
memorised its images says so, and a resume keeps what the first attempt chose. In-process runs (``run_here``) on
generated shapes folders; the choice itself is unit-tested in ../unit/test_defaults.py, the timing is in
``benchmarks/data/own_folder.py``."""

from __future__ import annotations

import pytest
import yaml
from conftest import FAST, check, metrics, run_here, summary
from datafiles import write_shapes_folder

from accel_train import defaults

MEMORISED = "warning: the model memorised its training images rather than learning the task"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """120 training and 30 test images of 3 shapes at 48 pixels (the README's folder, a little smaller)."""
    return write_shapes_folder(tmp_path_factory.mktemp("shapes") / "folder", size=48, seed=3)


def test_the_default_learns_a_small_folder_and_does_not_warn(shapes, tmp_path):
    """The README's command with no model or augmentation flag, cut to 250 steps (the default's 501 take twice as
    long; the benchmark runs them): small_cnn with crop + flip reaches >= 80% of the test shapes (measured 93-97% on
    three folders; lenet's default run: 23-43%), and a run that generalises ends without the warning."""
    out = tmp_path / "run"
    args = ["--dataset", f"imagefolder:{shapes}", "--output-dir", str(out), "--max-steps", "250", *FAST]
    proc = check(run_here("train.py", *args))
    chose = [line for line in proc.stdout.splitlines() if "defaults for your data" in line]
    assert len(chose) == 1 and "--model small_cnn" in chose[0] and "--augment" in chose[0], proc.stdout
    assert "--epochs" not in chose[0]  # --max-steps given: the length is the user's
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["resolved"]["augment"] == "random_crop(48, padding=6)+hflip"
    s = summary(out)
    assert s["global_step"] == 250 and s["eval_accuracy"] >= 0.8, s
    assert "warning" not in s and MEMORISED not in proc.stderr


def test_a_memorising_run_ends_with_one_line_saying_so(tmp_path):
    """lenet without augmentation for 40 epochs on 48 images: 100% of its training images, a test accuracy near
    chance; one warning line on stderr, the same words in summary.json."""
    root = write_shapes_folder(tmp_path / "tiny", per_class=16, test_per_class=8, size=32, seed=1)
    out = tmp_path / "run"
    args = ["--dataset", f"imagefolder:{root}", "--model", "lenet", "--no-augment", "--epochs", "40"]
    proc = check(run_here("train.py", *args, "--batch-size", "16", "--output-dir", str(out), *FAST))
    lines = [line for line in proc.stderr.splitlines() if line.startswith(MEMORISED)]
    assert len(lines) == 1, proc.stderr
    assert "try --augment, more training images" in lines[0]
    s = summary(out)
    assert lines[0] == f"warning: {s['warning']}"
    assert "defaults for your data" not in proc.stdout  # the model was picked: nothing chosen


def test_a_resume_keeps_what_the_first_attempt_chose(shapes, tmp_path, monkeypatch):
    """The default run says in one line what it chose and why, and records it in config.yaml: small_cnn, crop + flip,
    channels_last, 167 epochs (3 steps an epoch: at least 500 steps). Stopped at step 3 and resumed with no flags,
    the run is the one its first attempt chose, even if the rule has changed since (here: another model and
    minimum); nothing is chosen again, nothing counts as a change, and config.yaml keeps the first record."""
    out = tmp_path / "run"
    base = ["--dataset", f"imagefolder:{shapes}", "--output-dir", str(out), *FAST]
    proc = check(run_here("train.py", *base, "--stop-at-step", "3"))
    chose = [line for line in proc.stdout.splitlines() if "defaults for your data" in line]
    assert len(chose) == 1, proc.stdout
    for part in ("--model small_cnn", "--augment", "--channels-last", "--epochs 167 (501 steps: at least 500)"):
        assert part in chose[0], chose[0]
    first = yaml.safe_load((out / "config.yaml").read_text())
    assert (first["model"], first["augment"], first["channels_last"], first["epochs"]) == (
        defaults.MODEL,
        True,
        True,
        167,
    )
    record = first["resolved"]["defaults"]
    assert record["model"] == defaults.MODEL and record["min_steps"] == 500 and "no --model was given" in record["why"]
    monkeypatch.setattr(defaults, "MODEL", "mnist_cnn")
    monkeypatch.setattr(defaults, "MIN_STEPS", 900)
    proc = check(run_here("train.py", *base, "--resume", "auto", "--stop-at-step", "6"))
    assert "defaults for your data" not in proc.stdout
    again = yaml.safe_load((out / "config.yaml").read_text())
    for key in ("model", "augment", "channels_last", "epochs"):
        assert again[key] == first[key], key
    assert again["resolved"]["defaults"] == first["resolved"]["defaults"]
    assert again["resolved"]["total_steps"] == 501
    resume = [m for m in metrics(out) if m["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["changed"] == {}


@pytest.mark.parametrize(
    "batching",
    [["--batch-size", "4", "--grad-accum-steps", "2"], ["--global-batch-size", "8", "--max-device-batch", "4"]],
    ids=["grad-accum-steps", "max-device-batch"],
)
def test_the_least_steps_are_optimizer_steps_under_accumulation(tmp_path, batching):
    """48 images at a global batch of 8 as 2 micro-batches of 4: 6 optimizer steps an epoch (12 micro-batches). The
    default length is at least 500 optimizer steps: 84 epochs, 504 steps, as the start lines say and config.yaml
    records (counted in micro-batches: 42 epochs, 252 steps). Stopped at step 1: the plan is what is checked; the
    trainer takes its total_steps (test_trainer_runs.py)."""
    root = write_shapes_folder(tmp_path / "tiny", per_class=16, test_per_class=2, size=8, seed=0)
    out = tmp_path / "run"
    args = ["--dataset", f"imagefolder:{root}", "--image-size", "8", *batching, "--output-dir", str(out), *FAST]
    proc = check(run_here("train.py", *args, "--stop-at-step", "1"))
    resolved = yaml.safe_load((out / "config.yaml").read_text())["resolved"]
    assert (resolved["accum_steps"], resolved["global_batch"], resolved["steps_per_epoch"]) == (2, 8, 6), resolved
    epochs = resolved["defaults"]["epochs"]
    assert resolved["total_steps"] == epochs * 6 >= defaults.MIN_STEPS > (epochs - 1) * 6  # no more than needed
    chose = [line for line in proc.stdout.splitlines() if "defaults for your data" in line]
    assert len(chose) == 1 and f"--epochs {epochs} ({epochs * 6} steps: at least 500)" in chose[0], proc.stdout
    assert f"{epochs * 6} steps (6/epoch)" in proc.stdout


def test_a_memorising_run_shorter_than_log_every_still_warns(tmp_path):
    """The memorising run above with --log-every longer than the run: no train record is logged, and the warning
    is still given, judged on the training figures of all its steps."""
    root = write_shapes_folder(tmp_path / "tiny", per_class=16, test_per_class=8, size=32, seed=1)
    out = tmp_path / "run"
    args = ["--dataset", f"imagefolder:{root}", "--model", "lenet", "--no-augment", "--epochs", "40"]
    proc = check(
        run_here("train.py", *args, "--batch-size", "16", "--log-every", "100000", "--output-dir", str(out), *FAST)
    )
    assert not [m for m in metrics(out) if m["event"] == "train"]
    lines = [line for line in proc.stderr.splitlines() if line.startswith(MEMORISED)]
    assert len(lines) == 1 and "training accuracy" in lines[0], proc.stderr
    assert lines[0] == f"warning: {summary(out)['warning']}"
