"""Issue 27, item 2: ``eval.py --dataset imagefolder:DIR`` scores every image of a folder of classes, and says so.

It scored 12 of 60 new images (``--val-split 0.2`` reused for a folder without ``train/``/``test/``) and refused a
folder holding only ``test/``. Now: a folder of class subfolders is scored whole; ``test/`` (or ``val/``) where the
folder has one; the part ``train.py`` held out only when asked (``--val-split``) or for the very folder the
weights trained on (with the run's split). One line says which. The weights here are an untrained LeNet written
directly: which images are scored does not depend on what it answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import check, run_here
from datafiles import write_image_folder

CLASSES = ["a", "b", "c"]


@pytest.fixture
def trained_on(tmp_path) -> Path:
    """The flat folder the weights record as their dataset: 3 classes x 10 images."""
    return write_image_folder(tmp_path / "trained_on", classes=CLASSES, per_class=10)


@pytest.fixture
def export(tmp_path, trained_on) -> Path:
    """RUN/model: a LeNet export for 3 classes x 3 channels x 16 x 16 that trained on ``trained_on``."""
    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    config = {
        "model": "lenet",
        "num_classes": 3,
        "in_channels": 3,
        "image_size": 16,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "class_names": CLASSES,
        "dataset": f"imagefolder:{trained_on}",
    }
    path = tmp_path / "run" / "model"
    export_weights(create_model("lenet", 3, 3, 16), path, config)
    return path


def _evaluate(export: Path, *args: str) -> tuple[dict, str]:
    """(report, the line saying what was scored) of eval.py --out."""
    report = export.parent / "eval.json"
    proc = check(run_here("eval.py", "--weights", str(export), *args, "--out", str(report), "--overwrite"))
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("evaluated ") and lines[1].startswith("accuracy "), proc.stdout
    return json.loads(report.read_text()), lines[0]


def _count(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*.png"))


def test_a_folder_of_classes_is_scored_whole(tmp_path, export):
    new = write_image_folder(tmp_path / "new", classes=CLASSES, per_class=7)
    report, line = _evaluate(export, "--dataset", f"imagefolder:{new}")
    assert report["samples"] == _count(new) == 21
    assert sum(map(sum, report["confusion_matrix"])) == 21
    assert line == f"evaluated every image in {new} (21, no train/ or test/ subfolders)"
    assert report["evaluated"] == line.removeprefix("evaluated ")

    proc = check(run_here("eval.py", "--weights", str(export), "--dataset", f"imagefolder:{new}"))  # JSON on stdout
    assert json.loads(proc.stdout)["evaluated"] == report["evaluated"] and proc.stderr == ""


def test_a_folder_with_only_test_or_val_is_scored_not_refused(tmp_path, export):
    for name in ("test", "val"):
        root = tmp_path / f"only_{name}"
        write_image_folder(root / name, classes=CLASSES, per_class=4)
        report, line = _evaluate(export, "--dataset", f"imagefolder:{root}")
        assert report["samples"] == 12 and line == f"evaluated every image in {root / name} (12, the only split)"
    from accel_train.config import parse_config
    from accel_train.data import build_dataset
    from accel_train.errors import UserError

    with pytest.raises(UserError, match=r"holds only val/: nothing to train on; put the training images in"):
        build_dataset(parse_config(["--dataset", f"imagefolder:{tmp_path / 'only_val'}"]).data_config())


def test_a_folder_with_train_and_test_scores_its_test_split(tmp_path, export):
    root = write_image_folder(tmp_path / "split", classes=CLASSES, per_class=6, with_splits=True)
    report, line = _evaluate(export, "--dataset", f"imagefolder:{root}")
    assert report["samples"] == _count(root / "test") == 9 and "(9, its test split)" in line
    proc = run_here("eval.py", "--weights", str(export), "--dataset", f"imagefolder:{root}", "--val-split", "0.2")
    assert proc.returncode == 2 and "has its own test split" in proc.stderr and "drop --val-split" in proc.stderr


def test_val_split_scores_exactly_the_part_train_py_holds_out(tmp_path, export):
    from accel_train.config import parse_config
    from accel_train.data import build_dataset

    new = write_image_folder(tmp_path / "new", classes=CLASSES, per_class=8)
    report, line = _evaluate(export, "--dataset", f"imagefolder:{new}", "--val-split", "0.25", "--seed", "5")
    held = build_dataset(
        parse_config(["--dataset", f"imagefolder:{new}", "--val-split", "0.25", "--seed", "5"]).data_config()
    )
    assert report["samples"] == len(held.test) == 6
    assert line.endswith(f"the 6 of 24 images in {new} that --val-split 0.25 --seed 5 holds out, as asked")
    report, _ = _evaluate(export, "--dataset", f"imagefolder:{new}", "--val-split", "0")  # 0: every image
    assert report["samples"] == 24


def test_the_folder_the_weights_trained_on_scores_the_runs_held_out_part(export, trained_on):
    report, line = _evaluate(export)  # no --dataset: the recorded one, which this export trained on
    assert (
        report["samples"] == 6 and "that --val-split 0.2 --seed 42 holds out; the weights trained on the rest" in line
    )
    assert "train.py's defaults" in line

    run_config = export.parent / "config.yaml"  # the run's own split, as train.py wrote it
    run_config.write_text(yaml.safe_dump({"dataset": f"imagefolder:{trained_on}", "val_split": 0.4, "seed": 7}))
    report, line = _evaluate(export, "--dataset", f"imagefolder:{trained_on}")  # the same folder, named
    assert report["samples"] == 12 and "--val-split 0.4 --seed 7 holds out" in line and str(run_config) in line
    report, line = _evaluate(export, "--val-split", "0")
    assert report["samples"] == 30 and line.startswith("evaluated every image in")


def test_classes_are_matched_by_name_and_images_read_as_the_model_reads(tmp_path, export):
    some = write_image_folder(tmp_path / "some", classes=["b", "c"], per_class=5, mode="L")  # gray, for RGB weights
    report, _ = _evaluate(export, "--dataset", f"imagefolder:{some}")
    rows = [sum(row) for row in report["confusion_matrix"]]
    assert report["samples"] == 10 and rows == [0, 5, 5]  # b is the model's class 1, not the folder's first
    assert report["per_class_accuracy"]["a"] is None  # no images of a: no score, not 0.0

    odd = write_image_folder(tmp_path / "odd", classes=["a", "zebra"], per_class=2)
    proc = run_here("eval.py", "--weights", str(export), "--dataset", f"imagefolder:{odd}")
    assert proc.returncode == 2 and "class folder(s) 'zebra' that the model does not know" in proc.stderr
    assert proc.stderr.count("\n") == 1
