"""A catalogue of bad inputs: each one ends in ONE line ``error: ...`` and leaves the disk as it was.

For every case: (1) the exit code (2 for user errors), (2) stderr is exactly one line that starts
with ``error:``, names the bad value and says what to do (never a traceback), (3) nothing that
existed before was modified and nothing was created: the watched trees (usually the whole test
folder, which holds the inputs AND the place where the output would go) are compared by path,
kind, size, mtime and content hash before and after.

Most cases are real subprocess runs of the scripts; where a family has many members (flag values,
YAML configs) one or two subprocesses prove the one-line format and the rest are checked in-process.


Whole runs and launches; the in-process tests are in ../unit/test_bad_inputs.py.
"""

from __future__ import annotations

import pickle
import shutil
import struct
from pathlib import Path

import pytest
from checks import raises_user_error, run_bad, snapshot
from conftest import FAST, check, run_here, summary
from datafiles import write_hf_disk, write_image_folder, write_mnist_idx


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """One tiny real run (2 steps of lenet on digits): a run directory with a checkpoint and an export."""
    run = tmp_path_factory.mktemp("trained") / "run"
    check(run_here("train.py", *FAST, "--max-steps", "2", "--batch-size", "16", "--output-dir", str(run)))
    assert (run / "checkpoints" / "step_00000002" / "progress.json").is_file()
    return run


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--bogus-flag"], ["unrecognized arguments: --bogus-flag", "--help"]),
        (["--lr", "abc"], ["--lr", "'abc'", "--help"]),
        (["--batch-size", "0"], ["--batch-size must be >= 1, got 0"]),
        (["--model", "nope"], ["unknown model 'nope'", "choose one of", "lenet"]),
        (["--dataset", "nope"], ["unknown dataset 'nope'", "choose one of", "digits", "imagefolder:<path>"]),
    ],
    ids=["unknown-flag", "lr-not-a-number", "batch-size-0", "unknown-model", "unknown-dataset"],
)
def test_cli_flag_errors_subprocess(tmp_path, args, needles):
    # the output directory must not be created when the run is refused
    run_bad("train.py", [*FAST, "--output-dir", str(tmp_path / "run"), *args], [tmp_path], needles, launch=True)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text,needles",
    [
        ("lr: 0.01\nepoch: 3\n", ["unknown key 'epoch'", "did you mean 'epochs'?"]),
        ("optimizer: no\n", ["optimizer: no was read as False", "quote it: optimizer: 'no'"]),
    ],
    ids=["unknown-key", "unquoted-no"],
)
def test_yaml_config_errors_subprocess(tmp_path, text, needles):
    config = tmp_path / "hp.yaml"
    config.write_text(text)
    args = [*FAST, "--config", str(config), "--output-dir", str(tmp_path / "run")]
    line = run_bad("train.py", args, [tmp_path], needles, launch=True)
    assert str(config) in line


def _corrupt_idx_magic(raw: Path) -> Path:
    path = raw / "train-images-idx3-ubyte"
    data = bytearray(path.read_bytes())
    data[:4] = struct.pack(">I", 0x00000DEA)
    path.write_bytes(bytes(data))
    return path


def _dataset_case(name: str, tmp: Path) -> tuple[list[str], list[str]]:
    """(train.py args, needles) for the dataset case ``name``, its files written under ``tmp``."""
    data = tmp / "data"
    data.mkdir()
    if name == "mnist-missing":
        needles = ["mnist not found", str(data / "MNIST" / "raw"), "train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
        return ["--dataset", "mnist", "--data-dir", str(data)], [*needles, "--download"]
    if name == "mnist-corrupt-header":
        bad = _corrupt_idx_magic(write_mnist_idx(data))
        needles = [f"corrupt IDX header in {bad}", "magic 0x00000dea", "re-download with --download"]
        return ["--dataset", "mnist", "--data-dir", str(data)], needles
    if name == "imagefolder-empty":
        (data / "images").mkdir()
        needles = [f"empty folder: {data / 'images'}", "one subfolder per class"]
        return ["--dataset", f"imagefolder:{data / 'images'}"], needles
    if name == "imagefolder-one-class":
        write_image_folder(data / "images", classes=("cats",), per_class=4)
        needles = [str(data / "images"), "only one class ('cats')", "need at least 2 classes"]
        return ["--dataset", f"imagefolder:{data / 'images'}"], needles
    if name == "hf-missing-column":
        write_hf_disk(data / "hf", n=12)
        needles = ["label column 'kind' not found", "available columns: image, label", "--label-column"]
        return ["--dataset", f"hf:{data / 'hf'}", "--label-column", "kind"], needles
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name", ["mnist-missing", "mnist-corrupt-header", "imagefolder-empty", "imagefolder-one-class", "hf-missing-column"]
)
def test_dataset_errors(tmp_path, name):
    args, needles = _dataset_case(name, tmp_path)
    # launched once: this error comes after torch and the data libraries are imported
    launch = name == "mnist-missing"
    run_bad("train.py", [*FAST, *args, "--output-dir", str(tmp_path / "run")], [tmp_path], needles, launch=launch)
    if name == "mnist-missing":
        assert list((tmp_path / "data").iterdir()) == []  # no MNIST/raw left behind under --data-dir


def _half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _not_a_checkpoint_needles(target: Path) -> list[str]:
    return [f"--resume {str(target)!r}", "not a checkpoint folder (no progress.json)", "'auto'"]


@pytest.mark.parametrize("kind", ["truncated-file", "empty-dir"])
def test_resume_from_something_that_is_not_a_checkpoint(tmp_path, trained_run, kind):
    if kind == "truncated-file":
        target = tmp_path / "ckpt.safetensors"
        shutil.copy(trained_run / "checkpoints" / "step_00000002" / "model.safetensors", target)
        _half(target)
    else:
        target = tmp_path / "ckpt"
        target.mkdir()
    args = [*FAST, "--resume", str(target), "--output-dir", str(tmp_path / "run")]
    run_bad("train.py", args, [tmp_path], _not_a_checkpoint_needles(target))


@pytest.mark.parametrize(
    "damage,needles",
    [
        ("model.safetensors", ["a file in it is missing, truncated or corrupt", "SafetensorError"]),
        ("random_states_0.pkl", ["random_states_0.pkl is truncated or corrupt"]),
    ],
    ids=["truncated-weights", "truncated-rng-state"],
)
def test_resume_from_a_damaged_checkpoint(tmp_path, trained_run, damage, needles):
    ckpt = tmp_path / "step_00000002"
    shutil.copytree(trained_run / "checkpoints" / "step_00000002", ckpt)
    _half(ckpt / damage)
    run_bad(
        "train.py",
        [*FAST, "--max-steps", "4", "--extend", "--resume", str(ckpt), "--output-dir", str(tmp_path / "run")],
        [tmp_path],
        [str(ckpt), *needles, "start a new --output-dir"],
    )


def test_resume_from_a_checkpoint_with_truncated_progress_in_process(tmp_path, trained_run):
    from accel_train.checkpoint.state import read_progress

    ckpt = tmp_path / "step_00000002"
    shutil.copytree(trained_run / "checkpoints" / "step_00000002", ckpt)
    _half(ckpt / "progress.json")
    before = snapshot(tmp_path)
    needles = [f"cannot read {ckpt / 'progress.json'}", "the checkpoint is incomplete", "start a new --output-dir"]
    raises_user_error(lambda: read_progress(ckpt), *needles)
    assert snapshot(tmp_path) == before


class _Payload:
    """Unpickling this creates ``marker``: proof that a loader executed code from the file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _weights_case(name: str, tmp: Path) -> tuple[Path, list[str]]:
    import torch

    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    if name == "truncated-pt":
        path = tmp / "model.pt"
        torch.save(create_model("lenet").state_dict(), path)
        _half(path)
        return path, [f"cannot load {path}", "truncated or corrupt", "re-export or re-copy it"]
    if name == "other-models-weights":
        path = tmp / "export"
        config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28, "dataset": "digits"}
        export_weights(create_model("mnist_cnn").state_dict(), path, config)
        needles = [
            f"weights from {path / 'model.safetensors'} do not fit LeNet",
            "missing keys: net.0.weight",
            "unexpected keys: classifier.",
            "another model architecture",
            "config says model=lenet",
            f"make {path / 'config.json'} describe these weights",
        ]
        return path, needles
    if name == "malicious-pt":
        path = tmp / "evil.pt"
        torch.save({"state_dict": create_model("lenet").state_dict(), "hook": _Payload(tmp / "PWNED")}, path)
        return path, [f"refused to load {path}", "it references io.open", "if you TRUST its origin"]
    if name == "malicious-raw-pickle":
        path = tmp / "evil.pkl"
        path.write_bytes(pickle.dumps({"weights": _Payload(tmp / "PWNED")}, protocol=4))
        return path, [f"refused to load {path}", "needs arbitrary code", "convert it from trusted code"]
    if name == "empty-dir":
        path = tmp / "empty"
        path.mkdir()
        return path, [f"no weights file in {path}", "looked for model.safetensors"]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name", ["truncated-pt", "other-models-weights", "malicious-pt", "malicious-raw-pickle", "empty-dir"]
)
def test_evaluate_bad_weights(tmp_path, name):
    weights, needles = _weights_case(name, tmp_path)
    out = tmp_path / "eval" / "report.json"
    launch = name == "truncated-pt"  # one launched case: the error comes after torch is imported
    run_bad("eval.py", ["--weights", str(weights), "--out", str(out)], [tmp_path], needles, launch=launch)
    assert not (tmp_path / "PWNED").exists()
    assert not out.parent.exists()


def test_output_dir_not_writable(tmp_path):
    # tests run as root, for whom chmod does not stop writes: a path under a regular file fails for everyone
    blocker = tmp_path / "somefile"
    blocker.write_text("I am a file\n")
    out = blocker / "run"
    needles = [f"--output-dir {out} is not writable", f"inside {blocker}, which is a file", "choose another folder"]
    run_bad("train.py", [*FAST, "--max-steps", "1", "--output-dir", str(out)], [tmp_path], needles)


def test_output_dir_holding_another_run(tmp_path, trained_run):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    base = [*FAST, "--max-steps", "3", "--batch-size", "8", "--output-dir", str(run)]
    needles = [f"--output-dir {run} already holds a run", "config.yaml", "--resume auto", "--overwrite"]
    run_bad("train.py", base, [tmp_path], needles)
    # --overwrite with another bad input still leaves the old run untouched (inputs are checked first) ...
    run_bad("train.py", [*base, "--overwrite", "--dataset", "nope"], [tmp_path], ["unknown dataset 'nope'"])
    # ... and with good inputs it replaces the run
    check(run_here("train.py", *base, "--overwrite"))
    assert summary(run)["global_step"] == 3 and summary(run)["micro_batch"] == 8
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003"]
