"""More of the catalogue of bad inputs (issue 16): every case ends in ONE ``error:`` line with exit code 2, or
works, with a warning where one is due. Never a traceback, a hang or a crash.

Same rules as ``test_bad_inputs.py`` (whose helpers this module uses): exit code, exactly one ``error:`` line,
no "Traceback" anywhere in the output, and the watched trees unchanged. Most cases run the command's
``main(argv)`` in this process through ``accel_train.cli.run_main`` (:func:`run_cli`: the same top level the
scripts have, at no subprocess cost); a few end-to-end representatives are real subprocesses.


Whole runs and launches; the in-process tests are in ../unit/test_input_checks.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import zlib
from pathlib import Path

import pytest
from checks import raises_user_error, run_bad, snapshot
from conftest import FAST, check, run_script
from datafiles import write_image_folder

from accel_train.cli import run_main
from accel_train.config import parse_config
from accel_train.errors import CheckpointError

SMALL = [
    "--dataset", "synthetic", "--synthetic-size", "128", "--synthetic-test-size", "32",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress",
]  # fmt: skip


CKPT = Path("checkpoints") / "step_00000002"


def run_cli(capsys, main, argv: list[str]) -> tuple[int, str, str]:
    """``run_main(main, argv)`` in this process, as the scripts run it: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_main(main, argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def one_line(code: int, out: str, err: str, *needles: str, exit_code: int = 2) -> str:
    """The in-process twin of ``assert_one_line_error``."""
    shown = f"exit {code}\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-5000:]}"
    assert code == exit_code, shown
    assert "Traceback" not in out + err, shown
    assert err.count("\n") == 1 and err.startswith("error: "), f"stderr is not one error line\n{shown}"
    for needle in needles:
        assert needle in err, f"{needle!r} missing from: {err}"
    return err.rstrip("\n")


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) if the block takes longer than ``seconds``: for FIFO cases."""

    def expired(signum, frame):
        raise AssertionError(f"still blocked after {seconds} s: the input was opened and read")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def bomb_png(path: Path, side: int = 30_000) -> Path:
    """A PNG whose header claims ``side`` x ``side`` pixels (900 M): a decompression bomb, a few bytes on disk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * (side + 1))  # one row; the header is what counts
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
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


def _folder_with(tmp_path: Path, *bad: str) -> Path:
    root = write_image_folder(tmp_path / "images", classes=("a", "b"), per_class=4, size=16)
    good = (root / "a" / "a_000.png").read_bytes()
    for name in bad:
        if name == "corrupt":
            (root / "a" / "corrupt.png").write_bytes(good[: len(good) // 2])  # truncated: fails verify()
        elif name == "empty":
            (root / "b" / "empty.png").write_bytes(b"")
        elif name == "text":
            (root / "b" / "readme.jpg").write_text("this is not an image\n")
    return root


def test_imagefolder_unreadable_images_through_train_script(tmp_path):
    root = _folder_with(tmp_path, "corrupt", "empty")
    args = [*FAST, "--dataset", f"imagefolder:{root}", "--output-dir", str(tmp_path / "run")]
    run_bad("train.py", args, [tmp_path], ["2 of 10 image files cannot be read", "corrupt.png", "empty.png"])


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
            "model must be one of airbench, lenet, mnist_cnn, resnet18, tv_resnet18, tv:NAME or "
            "package.module:callable, got 'vit'"
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


PROGRESS_CASES = [
    ("state-missing", lambda p: p.pop("state"), ["state is missing"]),
    ("global-step-string", lambda p: p["state"].update(global_step="2"), ["state.global_step must be an integer"]),
    (
        "global-step-negative",
        lambda p: p["state"].update(global_step=-5),
        ["state.global_step must be an integer >= 0"],
    ),
    ("best-metric-nan", lambda p: p["state"].update(best_metric=float("nan")), ["state.best_metric must be a finite"]),
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


def test_doctor_script_exit_code_for_fp8(tmp_path, capsys):
    from accel_train.commands.doctor import main

    path = tmp_path / "fp8.yaml"
    path.write_text("distributed_type: 'NO'\nmixed_precision: fp8\n")
    code, out, err = run_cli(capsys, main, ["--config_file", str(path)])
    assert code == 1 and "[fp8-unavailable]" in out and "Traceback" not in out + err  # 1: a broken config
