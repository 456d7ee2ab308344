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

import json
import pickle
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from checks import raises_user_error, run_bad, run_cli, snapshot
from conftest import FAST, check, run_here, run_script, summary
from datafiles import write_hf_disk, write_image_folder, write_mnist_idx
from helpers_bad_inputs import Payload, deadline, fifo, not_a_checkpoint_needles

from accel_train.config import parse_config
from accel_train.errors import CheckpointError


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
    run_bad("train.py", args, [tmp_path], not_a_checkpoint_needles(target))


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
        torch.save({"state_dict": create_model("lenet").state_dict(), "hook": Payload(tmp / "PWNED")}, path)
        return path, [f"refused to load {path}", "it references io.open", "if you TRUST its origin"]
    if name == "malicious-raw-pickle":
        path = tmp / "evil.pkl"
        path.write_bytes(pickle.dumps({"weights": Payload(tmp / "PWNED")}, protocol=4))
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


# ---- flag values through train.py ------------------------------------------------------------------------------------


def test_flag_nan_through_train_script(tmp_path):
    """End to end: a NaN timeout used to reach ``timedelta`` (a traceback); now one line before any output."""
    args = [*FAST, "--dist-timeout", "nan", "--output-dir", str(tmp_path / "run")]
    run_bad("train.py", args, [tmp_path], ["--dist-timeout must be > 0 seconds", "got nan"])


def test_huge_threads_through_train_script(tmp_path):
    """End to end: --threads 100000 was a segfault (exit 139); now a warning and a normal run."""
    proc = check(
        run_script("train.py", *FAST, "--threads", "100000", "--max-steps", "1", "--output-dir", str(tmp_path))
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "warning: --threads 100000 is more than the" in proc.stderr


# ---- predict.py and eval.py: images and weights files ----------------------------------------------------------------


SMALL = [
    "--dataset", "synthetic", "--synthetic-size", "128", "--synthetic-test-size", "32",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress",
]  # fmt: skip


CKPT = Path("checkpoints") / "step_00000002"


def one_line(code: int, out: str, err: str, *needles: str, exit_code: int = 2) -> str:
    """The in-process twin of ``assert_one_line_error``."""
    shown = f"exit {code}\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-5000:]}"
    assert code == exit_code, shown
    assert "Traceback" not in out + err, shown
    assert err.count("\n") == 1 and err.startswith("error: "), f"stderr is not one error line\n{shown}"
    for needle in needles:
        assert needle in err, f"{needle!r} missing from: {err}"
    return err.rstrip("\n")


def bomb_png(path: Path, side: int = 30_000) -> Path:
    """A PNG whose header claims ``side`` x ``side`` pixels (900 M): a decompression bomb, a few bytes on disk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * (side + 1))  # one row; the header is what counts
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A 2-step in-process run of lenet on 16x16 synthetic data: a checkpoint at step 2 and an export in model/."""
    from accel_train.loop import fit

    run = tmp_path_factory.mktemp("small") / "run"
    fit(parse_config([*SMALL, "--max-steps", "2", "--output-dir", str(run)]))
    assert (run / CKPT / "progress.json").is_file() and (run / "model" / "config.json").is_file()
    return run


@pytest.fixture
def image(tmp_path) -> Path:
    from PIL import Image

    path = tmp_path / "digit.png"
    Image.new("L", (16, 16), 128).save(path)
    return path


def test_predict_decompression_bomb(tmp_path, capsys, small_run):
    from accel_train.commands.predict import main

    bomb = bomb_png(tmp_path / "bomb.png")
    before = snapshot(tmp_path)
    code, out, err = run_cli(capsys, main, ["--weights", str(small_run / "model"), str(bomb)])
    one_line(code, out, err, f"image {bomb} is too large", "900,000,000 pixels", "decompression bomb")
    assert snapshot(tmp_path) == before


def test_predict_fifo_image_is_refused_not_read(tmp_path, capsys, small_run):
    from accel_train.commands.predict import main

    pipe = fifo(tmp_path / "digit.png")
    with deadline(60):
        code, out, err = run_cli(capsys, main, ["--weights", str(small_run / "model"), str(pipe)])
    one_line(code, out, err, f"{pipe} is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("program", ["predict", "evaluate"])
def test_fifo_weights_are_refused_not_read(tmp_path, capsys, image, program):
    import importlib

    main = importlib.import_module(f"accel_train.commands.{program}").main
    pipe = fifo(tmp_path / "model.safetensors")
    argv = ["--weights", str(pipe), *([str(image)] if program == "predict" else [])]
    with deadline(60):
        code, out, err = run_cli(capsys, main, argv)
    one_line(code, out, err, f"{pipe} is a FIFO (named pipe), not a regular file", "pass the weights file itself")


@pytest.mark.parametrize("size", ["0", "-3"])
def test_evaluate_batch_size(capsys, small_run, size):
    from accel_train.commands.evaluate import main

    code, out, err = run_cli(capsys, main, ["--weights", str(small_run / "model"), "--batch-size", size])
    one_line(code, out, err, f"--batch-size must be >= 1, got {size}")


def test_fifo_weights_through_eval_script(tmp_path):
    """End to end: it used to hang forever. (The FIFO lies outside the watched tree: hashing it would block.)"""
    (tmp_path / "pipes").mkdir()
    pipe = fifo(tmp_path / "pipes" / "weights.pt")
    out = tmp_path / "work" / "eval.json"
    out.parent.mkdir()
    args = ["--weights", str(pipe), "--out", str(out)]
    run_bad("eval.py", args, [out.parent], [f"{pipe} is a FIFO", "not a regular file"])


# ---- an export's config.json -----------------------------------------------------------------------------------------


EXPORT_CASES = [
    ("num-classes-string", {"num_classes": "ten"}, ["num_classes must be an integer between 1 and 100,000, got 'ten'"]),
    ("num-classes-inf", {"num_classes": float("inf")}, ["num_classes must be an integer", "got inf"]),
    ("num-classes-0", {"num_classes": 0}, ["num_classes must be an integer between 1 and 100,000, got 0"]),
    ("class-names-short", {"class_names": ["zero", "one"]}, ["class_names has 2 names but num_classes is 10"]),
    ("mean-null", {"mean": None}, ["mean must be a finite number or a list of them", "got null"]),
    ("std-string", {"std": "0.3"}, ["std must be a finite number or a list of them", "got '0.3'"]),
    ("std-zero", {"std": [0]}, ["std must be positive, got [0]"]),
    ("image-size-huge", {"image_size": 10**12}, ["image_size must be an integer between 14 and 4,096"]),
    ("image-size-small", {"image_size": 8}, ["image_size must be an integer between 14 and 4,096, got 8"]),
    (
        "model-unknown",
        {"model": "vit"},
        [
            "model must be one of airbench, lenet, mnist_cnn, resnet18, small_cnn, small_cnn_gn, tv_resnet18, "
            "tv:NAME or package.module:callable, got 'vit'"
        ],
    ),
]


def _broken_export(run: Path, tmp_path: Path, change: dict) -> Path:
    export = tmp_path / "export"
    shutil.copytree(run / "model", export)
    config = json.loads((export / "config.json").read_text())
    config.update(change)
    (export / "config.json").write_text(json.dumps(config))  # Infinity for inf, as Python's json writes it
    return export


@pytest.mark.parametrize("program", ["predict", "evaluate"])
@pytest.mark.parametrize("name,change,needles", EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_export_config_in_process(tmp_path, capsys, small_run, image, program, name, change, needles):
    import importlib

    main = importlib.import_module(f"accel_train.commands.{program}").main
    export = _broken_export(small_run, tmp_path, change)
    argv = ["--weights", str(export), str(image)] if program == "predict" else ["--weights", str(export)]
    before = snapshot(tmp_path)
    code, out, err = run_cli(capsys, main, argv)
    one_line(code, out, err, f"{export / 'config.json'}: ", *needles)
    assert snapshot(tmp_path) == before


def test_export_config_lenet_too_large(tmp_path, capsys, small_run, image):
    """4096 is within the size limit, but lenet's dense layer would need 6.7 G parameters: refused before any."""
    from accel_train.commands.predict import main

    export = _broken_export(small_run, tmp_path, {"image_size": 4096})
    code, out, err = run_cli(capsys, main, ["--weights", str(export), str(image)])
    one_line(code, out, err, "would have 6,671,", "parameters", "use a smaller image_size", str(export / "config.json"))


def test_export_config_through_predict_script(tmp_path, small_run, image):
    export = _broken_export(small_run, tmp_path, {"num_classes": "ten"})
    needles = [f"{export / 'config.json'}: num_classes must be an integer", "got 'ten'"]
    run_bad("predict.py", ["--weights", str(export), str(image)], [tmp_path], needles)


# ---- a checkpoint's progress.json ------------------------------------------------------------------------------------


PROGRESS_CASES = [
    ("state-missing", lambda p: p.pop("state"), ["state is missing"]),
    ("global-step-string", lambda p: p["state"].update(global_step="2"), ["state.global_step must be an integer"]),
    (
        "global-step-negative",
        lambda p: p["state"].update(global_step=-5),
        ["state.global_step must be an integer >= 0"],
    ),
    ("best-metric-nan", lambda p: p["state"].update(best_metric=float("nan")), ["state.best_metric must be a finite"]),
    (
        "last-eval-step-string",
        lambda p: p["state"].update(last_eval_step="4"),
        ["state.last_eval_step must be an integer"],
    ),
    ("scheduler-list", lambda p: p.update(scheduler=[1, 2]), ["scheduler must be a JSON object, got [1, 2]"]),
    ("config-seed", lambda p: p["config"].update(seed=-1), ["config is invalid (--seed must be between 0"]),
    ("config-lr-string", lambda p: p["config"].update(lr="fast"), ["config.lr must be float, got 'fast'"]),
    ("model-config", lambda p: p["model_config"].update(num_classes=None), ["(model_config): num_classes must be"]),
    ("malformed", None, ["cannot read", "the checkpoint is incomplete"]),
]


def _damaged_run(run: Path, tmp_path: Path, damage) -> tuple[Path, Path]:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    progress = copy / CKPT / "progress.json"
    if damage is None:
        progress.write_text(progress.read_text()[:40])
    else:
        data = json.loads(progress.read_text())
        damage(data)
        progress.write_text(json.dumps(data))
    return copy, progress


@pytest.mark.parametrize("name,damage,needles", PROGRESS_CASES, ids=[c[0] for c in PROGRESS_CASES])
def test_progress_json_in_process(tmp_path, small_run, name, damage, needles):
    """What a resume reads of a checkpoint: its progress.json (``read_progress``), then the run config in it
    (checked by the config layer, which owns its fields)."""
    from accel_train.checkpoint.state import read_progress
    from accel_train.config import check_saved_config

    run, progress = _damaged_run(small_run, tmp_path, damage)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as info:
        check_saved_config(read_progress(progress.parent)["config"], str(progress))
    message = str(info.value)
    assert "\n" not in message and str(progress) in message, message
    for needle in needles:
        assert needle in message, f"{needle!r} missing from: {message}"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("resume", ["auto", "path"])
@pytest.mark.parametrize("name", ["state-missing", "global-step-string", "malformed"])
def test_resume_from_a_damaged_progress_json(tmp_path, capsys, small_run, name, resume):
    """``--resume auto`` used to skip an unreadable checkpoint and start over silently (exit 0)."""
    from accel_train.commands.train import main

    damage = next(d for n, d, _ in PROGRESS_CASES if n == name)
    run, progress = _damaged_run(small_run, tmp_path, damage)
    before = snapshot(tmp_path)
    target = "auto" if resume == "auto" else str(progress.parent)
    code, out, err = run_cli(capsys, main, [*SMALL, "--max-steps", "4", "--output-dir", str(run), "--resume", target])
    line = one_line(code, out, err, str(progress))
    if resume == "auto":
        assert "--resume auto: the newest checkpoint cannot be used, so the run is not started over" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("resume", ["auto", "path"])
def test_resume_from_a_checkpoint_with_a_damaged_config(tmp_path, capsys, small_run, resume):
    """The saved config is checked by the config layer when a resume reads it: one line, nothing written."""
    from accel_train.commands.train import main

    run, progress = _damaged_run(small_run, tmp_path, lambda p: p["config"].update(lr="fast"))
    before = snapshot(tmp_path)
    target = "auto" if resume == "auto" else str(progress.parent)
    code, out, err = run_cli(capsys, main, [*SMALL, "--max-steps", "4", "--output-dir", str(run), "--resume", target])
    line = one_line(code, out, err, str(progress))
    assert "config.lr must be float, got 'fast'" in line and "the checkpoint is damaged" in line, line
    assert snapshot(tmp_path) == before


def test_resume_auto_with_a_checkpoint_folder_without_progress(tmp_path, small_run):
    from accel_train.checkpoint.state import resolve_resume

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    (run / CKPT / "progress.json").unlink()
    raises_user_error(lambda: resolve_resume("auto", run), "--resume auto", "not started over", "progress.json")


def test_resume_auto_skips_an_older_damaged_checkpoint(tmp_path, small_run):
    """Only a damaged checkpoint at least as new as the latest usable one is refused."""
    from accel_train.checkpoint.state import resolve_resume

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    older = run / "checkpoints" / "step_00000001"
    shutil.copytree(run / CKPT, older)
    (older / "progress.json").write_text("{")
    assert resolve_resume("auto", run) == run / CKPT


def test_resume_with_another_optimizer(tmp_path, capsys, small_run):
    from accel_train.commands.train import main

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    before = snapshot(tmp_path)
    argv = [*SMALL, "--max-steps", "2", "--output-dir", str(run), "--resume", "auto", "--optimizer", "sgd"]
    code, out, err = run_cli(capsys, main, argv)
    one_line(code, out, err, "--optimizer (the run has 'adam')", "cannot change that", "another --output-dir")
    assert snapshot(tmp_path) == before


# ---- user mistakes through train.py, and --debug ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--lr", "abc"], "--lr"),
        (["--model", "vgg99"], "unknown model 'vgg99'"),
        (["--dataset", "no_such_dataset"], "unknown dataset 'no_such_dataset'"),
        (["--config", "no/such/config.yaml"], "file not found"),
    ],
    ids=["bad-flag-value", "unknown-model", "unknown-dataset", "missing-config"],
)
def test_user_mistakes_are_one_line_errors(tmp_path, args, expect):
    proc = run_script("train.py", "--output-dir", str(tmp_path / "run"), *args, *FAST, "--max-steps", "1")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert expect in errors[0], errors[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_debug_shows_the_traceback(tmp_path):
    proc = run_script("train.py", "--output-dir", str(tmp_path / "run"), "--lr", "abc", "--debug")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert sum(line.startswith("error:") for line in proc.stderr.splitlines()) == 1
