"""``eval.py`` (``accel_train/saved_eval.py``, ``commands/evaluate.py``) on the data it is given: a test split alone
is enough, and its errors name only flags eval has. A whole folder of classes: test_eval_whole_folder.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checks import raises_user_error
from datafiles import MNIST_NAMES, write_mnist_idx

from accel_train.config import parse_config


def _mnist_export(path: Path) -> Path:
    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28, "dataset": "mnist"}
    export_weights(create_model("lenet").state_dict(), path, {**config, "mean": [0.1307], "std": [0.3081]})
    return path


def test_eval_scores_mnist_from_the_t10k_files_alone(tmp_path):
    from accel_train.saved_eval import run_evaluation

    raw = write_mnist_idx(tmp_path / "data", n_train=40, n_test=20)
    for name in MNIST_NAMES["train"]:
        (raw / name).unlink()
    export = _mnist_export(tmp_path / "export")
    report = run_evaluation(str(export), data_dir=str(tmp_path / "data"), out=str(tmp_path / "eval.json"))
    assert report["samples"] == 20 and report["dataset"] == "mnist"
    assert json.loads((tmp_path / "eval.json").read_text())["samples"] == 20

    # training still needs (and names) the train files, and keeps suggesting its own --download
    train = parse_config(["--dataset", "mnist", "--data-dir", str(tmp_path / "data")])
    from accel_train.data import build_dataset

    raises_user_error(lambda: build_dataset(train.data_config()), "missing: train-images-idx3-ubyte", "with --download")


def test_eval_errors_suggest_no_flag_eval_lacks(tmp_path):
    from accel_train.saved_eval import run_evaluation

    export = _mnist_export(tmp_path / "export")
    message = raises_user_error(
        lambda: run_evaluation(str(export), data_dir=str(tmp_path / "none")),
        "missing: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte",
        "train.py --download",
    )
    assert "train-images" not in message and "Pass --download" not in message

    raw = write_mnist_idx(tmp_path / "data")
    (raw / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x99" + b"\x00" * 12)
    raises_user_error(
        lambda: run_evaluation(str(export), data_dir=str(tmp_path / "data")),
        "corrupt IDX header",
        "re-download with train.py --download",
    )

    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    bare = tmp_path / "bare"
    export_weights(create_model("lenet").state_dict(), bare, None)  # no config.json: the model is unknown
    message = raises_user_error(lambda: run_evaluation(str(bare)), "does not record its model", "convert_checkpoint.py")
    assert "e.g. --model" not in message


def test_eval_has_the_hf_column_flags_its_errors_name(capsys):
    from accel_train.commands import evaluate

    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    text = capsys.readouterr().out
    assert "--image-column" in text and "--label-column" in text and "--download" not in text
