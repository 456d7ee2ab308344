"""accel_train/data/settings.py: a flag the dataset would ignore is refused (one line), never ignored."""

from __future__ import annotations

from accel_train.data.settings import flags_that_do_not_apply


def test_flags_that_change_nothing_are_named():
    assert flags_that_do_not_apply("digits", {"image_column": "img", "label_column": "y"}, False) == [
        "--image-column (for hf:, shards:)",
        "--label-column (for hf:, shards:)",
    ]
    assert flags_that_do_not_apply("imagefolder:x", {"data_dir": "/d", "download": True}, False) == [
        "--data-dir (for mnist, fashion_mnist, cifar10)",
        "--download (for mnist, fashion_mnist, cifar10)",
    ]
    assert flags_that_do_not_apply("imagefolder:x", {"synthetic_size": 8}, False) == [
        "--synthetic-size (for synthetic)"
    ]
    assert flags_that_do_not_apply("hf:x", {"val_split": 0.3}, True) == [
        "--val-split (this data has a test split of its own)"
    ]


def test_flags_that_apply_pass():
    assert flags_that_do_not_apply("hf:x", {"image_column": "i", "label_column": "l", "val_split": 0.3}, False) == []
    assert flags_that_do_not_apply("shards:x", {"label_column": "l"}, True) == []
    assert flags_that_do_not_apply("cifar10", {"data_dir": "/d", "download": True}, False) == []
    assert flags_that_do_not_apply("synthetic", {"synthetic_size": 8, "synthetic_classes": 3}, False) == []
    assert flags_that_do_not_apply("digits", None, False) == []


def test_a_flag_at_its_default_changes_nothing_and_passes():
    """A recipe's data_dir: data (the default) beside another dataset is not an error."""
    assert flags_that_do_not_apply("synthetic", {"data_dir": "data", "download": False}, False) == []


def test_an_image_folder_refuses_column_flags_for_training_and_evaluation(tmp_path):
    """The folder's builders (train.py's and accel-evaluate's) refuse by the same rule as the run."""
    from checks import raises_user_error
    from datafiles import write_image_folder

    from accel_train.data import DataConfig, build_dataset
    from accel_train.data.folder import build_imagefolder_eval

    root = write_image_folder(tmp_path / "imgs", per_class=4, size=8)
    cfg = DataConfig(dataset=f"imagefolder:{root}", label_column="label")
    for build in (lambda: build_dataset(cfg), lambda: build_imagefolder_eval(cfg, str(root), False)):
        raises_user_error(build, "--label-column (for hf:, shards:)", "drop it")
