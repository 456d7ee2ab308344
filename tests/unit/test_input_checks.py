"""More of the catalogue of bad inputs (issue 16): every case ends in ONE ``error:`` line with exit code 2, or
works, with a warning where one is due. Never a traceback, a hang or a crash.

Same rules as ``test_bad_inputs.py`` (whose helpers this module uses): exit code, exactly one ``error:`` line,
no "Traceback" anywhere in the output, and the watched trees unchanged. Most cases run the command's
``main(argv)`` in this process through ``accel_train.cli.run_main`` (:func:`run_cli`: the same top level the
scripts have, at no subprocess cost); a few end-to-end representatives are real subprocesses.


The in-process tests; whole runs and launches are in ../integration/test_input_checks_runs.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from checks import raises_user_error, snapshot
from datafiles import undecodable_png, write_image_folder

from accel_train.config import parse_config
from accel_train.errors import CheckpointError, UserError


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


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


FLAG_CASES = [
    (["--dist-timeout", "nan"], ["--dist-timeout must be > 0 seconds", "got nan"]),
    (["--dist-timeout", "inf"], ["--dist-timeout must be > 0 seconds", "365 days", "got inf"]),
    (["--weight-decay", "nan"], ["--weight-decay must be a finite number, got nan"]),
    (["--weight-decay", "inf"], ["--weight-decay must be a finite number, got inf"]),
    (["--momentum", "nan"], ["--momentum must be a finite number, got nan"]),
    (["--max-grad-norm=-inf"], ["--max-grad-norm must be >= 0, got -inf"]),
    (["--image-size", "4"], ["--image-size 4 is too small for --model lenet", "at least 14x14", "--image-size 14"]),
    (["--dataset", "synthetic", "--synthetic-image-size", "8"], ["--synthetic-image-size 8 is too small"]),
    (["--image-size", "100000"], ["--image-size must be at most 4,096, got 100000"]),
    (["--seed", "-1"], ["--seed must be between 0 and 2**32 - 1", "got -1"]),
    (["--seed", str(2**32)], ["--seed must be between 0 and 2**32 - 1", f"got {2**32}"]),
    (["--batch-size", "9" * 40], ["--batch-size must be at most", "a 40-digit number"]),
    (["--output-dir", ""], ["--output-dir needs a non-empty value"]),
    (["--model", "nope"], ["unknown model 'nope'", "lenet"]),
]


@pytest.mark.parametrize("args,needles", FLAG_CASES, ids=[" ".join(a)[:40] for a, _ in FLAG_CASES])
def test_flag_values_in_process(args, needles):
    raises_user_error(lambda: parse_config(args), *needles)


def test_flags_that_work():
    assert parse_config(["--seed", str(2**32 - 1)]).seed == 2**32 - 1
    assert parse_config(["--seed", "0", "--image-size", "14"]).image_size == 14
    assert parse_config(["--model", "resnet18", "--image-size", "4"]).image_size == 4  # global pooling: any size


YAML_CASES = [
    ("seed: 4294967296\n", ["--seed must be between 0 and 2**32 - 1", "got 4294967296"]),
    ("seed: -3\n", ["--seed must be between 0 and 2**32 - 1", "got -3"]),
    ("dist_timeout: .nan\n", ["--dist-timeout must be > 0 seconds", "got nan"]),
    ("weight_decay: .inf\n", ["--weight-decay must be a finite number, got inf"]),
    ("momentum: .nan\n", ["--momentum must be a finite number, got nan"]),
    ("image_size: 4\n", ["--image-size 4 is too small for --model lenet"]),
    ("lr: 0.1\nepochs: 2\nlr: 0.2\n", ["key 'lr' appears twice", "lines 1 and 3", "keep one"]),
    ("lr: 0.1\n\x00epochs: 2\n", ["NUL byte on line 2", "pass a YAML file"]),
    ('output_dir: "runs/a\\0b"\n', ["--output-dir needs a non-empty value without NUL bytes"]),
]


@pytest.mark.parametrize(
    "text,needles", YAML_CASES, ids=[t.split(":")[0] + str(i) for i, (t, _) in enumerate(YAML_CASES)]
)
def test_yaml_values_in_process(tmp_path, text, needles):
    config = tmp_path / "hp.yaml"
    config.write_text(text)
    before = snapshot(tmp_path)
    raises_user_error(lambda: parse_config(["--config", str(config)]), *needles)
    assert snapshot(tmp_path) == before


def test_yaml_config_that_is_a_fifo_or_a_folder(tmp_path):
    pipe = fifo(tmp_path / "hp.yaml")
    with deadline(60):
        raises_user_error(lambda: parse_config(["--config", str(pipe)]), f"--config {pipe} is a FIFO (named pipe)")
    raises_user_error(lambda: parse_config(["--config", str(tmp_path)]), f"--config {tmp_path} is a directory")


def test_yaml_with_a_bom_is_read(tmp_path):
    """A UTF-8 byte-order mark (some Windows editors write one) is dropped, not an error."""
    config = tmp_path / "hp.yaml"
    config.write_bytes(b"\xef\xbb\xbfepochs: 3\nlr: 0.01\n")
    cfg = parse_config(["--config", str(config)])
    assert (cfg.epochs, cfg.lr) == (3, 0.01)


def test_threads_beyond_the_cores_are_capped(capsys):
    import torch

    from accel_train.runtime import available_cores, configure_threads

    before = torch.get_num_threads()
    try:
        assert configure_threads(1_000_000) == available_cores() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: --threads 1000000 is more than the"), err


class _Recorder:
    def __init__(self):
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.lines.append(message)


def test_run_length_warnings():
    from accel_train.data.base import DataSplits
    from accel_train.plan_warnings import run_length_warnings, warn_about_run

    cfg = parse_config(["--warmup-steps", "50", "--eval-every", "100", "--checkpoint-every", "200"])
    warnings = run_length_warnings(cfg, total_steps=40)
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert "--warmup-steps 50 is longer than the run (the run has 40 optimizer step(s))" in warnings[0]
    assert "--eval-every 100 is beyond the run" in warnings[1] and "never fires" in warnings[1]
    assert "--checkpoint-every 200 is beyond the run" in warnings[2]
    assert run_length_warnings(parse_config(["--warmup-steps", "40", "--eval-every", "40"]), 40) == []
    rt = _Recorder()
    splits = DataSplits(None, None, None, extra={"notes": ["a note"]})
    warn_about_run(cfg, rt, splits, 40)
    assert rt.lines == [*warnings, "a note"]


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


@pytest.mark.parametrize(
    "bad,needles",
    [
        (["corrupt"], ["1 of 9 image files cannot be read", "a/corrupt.png"]),
        (["empty"], ["1 of 9 image files cannot be read", "b/empty.png (empty (0 bytes))"]),
        (["text"], ["1 of 9 image files cannot be read", "b/readme.jpg (not an image file"]),
        (
            ["corrupt", "empty", "text"],
            ["3 of 11 image files cannot be read", "corrupt.png", "empty.png", "readme.jpg"],
        ),
    ],
    ids=["corrupt-png", "zero-bytes", "text-file", "all-three"],
)
def test_imagefolder_unreadable_images_in_process(tmp_path, bad, needles):
    from accel_train.data import build_dataset

    root = _folder_with(tmp_path, *bad)
    before = snapshot(tmp_path)
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    message = raises_user_error(lambda: build_dataset(cfg), str(root), *needles, "remove or replace them")
    assert message.startswith(f"{root}: ")
    assert snapshot(tmp_path) == before


def test_imagefolder_ignores_other_files(tmp_path):
    from accel_train.data import build_dataset

    root = _folder_with(tmp_path)
    (root / "a" / "notes.txt").write_text("not an image, not an image extension: not indexed\n")
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
    assert len(splits.train) + len(splits.test) == 8 and splits.extra["notes"] == []


def test_imagefolder_of_mixed_modes_says_how_they_are_converted(tmp_path):
    from PIL import Image

    from accel_train.data import build_dataset

    root = write_image_folder(tmp_path / "images", classes=("a", "b"), per_class=4, size=16, mode="L")
    for path in sorted(root.glob("b/*.png"))[:2]:
        Image.open(path).convert("RGBA").save(path)
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
    assert splits.info.in_channels == 3  # colour wins: nothing is lost converting grayscale to RGB
    (note,) = splits.extra["notes"]
    assert "\n" not in note and f"{root} mixes image modes (L: 6, RGBA: 2)" in note
    assert "every image is converted to RGB (3 channels); alpha channels are dropped" in note


def test_imagefolder_image_that_only_fails_to_decode(tmp_path):
    """Checksums valid, pixels not: the up-front check passes it; decoding it (for the statistics the build
    estimates, or as a sample in an epoch) is one line naming the file."""
    from accel_train.data import build_dataset

    root = _folder_with(tmp_path)
    bad = undecodable_png(root / "a" / "a_001.png")

    def read_everything():
        splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}"]).data_config())
        for dataset in (splits.train, splits.test):
            for index in range(len(dataset)):
                dataset[index]

    raises_user_error(read_everything, f"cannot decode image {bad}", "broken data stream", "remove or replace it")


def test_imagefolder_with_a_directory_loop(tmp_path):
    from accel_train.data import build_dataset

    root = _folder_with(tmp_path)
    (root / "a" / "loop").symlink_to(root)
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    raises_user_error(lambda: build_dataset(cfg), "links back to", "a directory loop")


@pytest.mark.parametrize(
    "text,code,needles",
    [
        ("distributed_type: MULTI_GPU\nnum_processes: 0\n", "invalid-value", ["num_processes: 0 is invalid"]),
        ("distributed_type: 'NO'\nnum_processes: 0\n", "invalid-value", ["num_processes: 0 is invalid"]),
        ("distributed_type: 'NO'\nmixed_precision: fp8\n", "fp8-unavailable", ["fp8 needs a CUDA GPU", "'bf16'"]),
        ("distributed_type: 'NO'\nuse_cpu: true\nmixed_precision: fp8\n", "fp8-unavailable", ["runs on cpu"]),
    ],
    ids=["num-processes-0-multi-gpu", "num-processes-0", "fp8-on-cpu", "fp8-use-cpu"],
)
def test_doctor_calls_launcher_failures_errors(tmp_path, text, code, needles):
    from accel_train.doctor import Environment, diagnose_config

    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    diag = diagnose_config(path, Environment(cuda_device_count=0, cpu_count=2, port_in_use=lambda port: False))
    found = [f for f in diag.findings if f.level == "error" and f.code == code]
    assert found and not diag.ok, diag.findings
    for needle in needles:
        assert needle in found[0].message, found[0].message


def test_doctor_gpu_ids_all_on_cpu_is_fine(tmp_path):
    from accel_train.doctor import Environment, diagnose_config

    path = tmp_path / "accelerate.yaml"
    path.write_text("distributed_type: 'NO'\nnum_processes: 1\ngpu_ids: all\nmixed_precision: 'no'\n")
    diag = diagnose_config(path, Environment(cuda_device_count=0, cpu_count=2, port_in_use=lambda port: False))
    assert diag.ok and not diag.warnings, diag.findings


def test_user_errors_are_one_family():
    """Everything above is a UserError (exit 2): CheckpointError included."""
    assert issubclass(CheckpointError, UserError) and UserError.exit_code == 2
