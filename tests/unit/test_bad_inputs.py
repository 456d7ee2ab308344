"""A catalogue of bad inputs: each one ends in ONE line ``error: ...`` and leaves the disk as it was.

For every case: (1) the exit code (2 for user errors), (2) stderr is exactly one line that starts
with ``error:``, names the bad value and says what to do (never a traceback), (3) nothing that
existed before was modified and nothing was created: the watched trees (usually the whole test
folder, which holds the inputs AND the place where the output would go) are compared by path,
kind, size, mtime and content hash before and after.

Most cases are real subprocess runs of the scripts; where a family has many members (flag values,
YAML configs) one or two subprocesses prove the one-line format and the rest are checked in-process.


The in-process tests; whole runs and launches are in ../integration/test_bad_inputs_runs.py.
"""

from __future__ import annotations

import pickle

import pytest
from checks import raises_user_error, snapshot
from helpers_bad_inputs import Payload, not_a_checkpoint_needles

from accel_train.config import parse_config

CLI_IN_PROCESS = [
    (["--optimizer", "rmsprop"], ["--optimizer", "invalid choice: 'rmsprop'", "choose from", "'adamw'", "--help"]),
    (["--lr", "-1"], ["--lr must be a positive number, got -1.0"]),
    (["--lr", "nan"], ["--lr must be a positive number, got nan"]),
    (["--val-split", "1.5"], ["--val-split must be between 0 and 1, got 1.5"]),
    (["--val-split", "0"], ["--val-split must be between 0 and 1, got 0.0"]),
    (["--epochs", "1.5"], ["--epochs", "invalid int value: '1.5'", "--help"]),
    (["--eval-every", "-1"], ["--eval-every must be >= 0, got -1"]),
    (["--stop-grace", "0"], ["--stop-grace must be a positive number of seconds, got 0.0"]),
    (["--mixed-precision", "fp8"], ["--mixed-precision", "'fp8'", "bf16"]),
    (["--max-device-batch", "8"], ["--max-device-batch only applies with --global-batch-size", "set G or drop it"]),
    (["--global-batch-size", "32", "--grad-accum-steps", "2"], ["--grad-accum-steps is derived", "drop one"]),
    (["--resume", "/no/such/ckpt"], ["--resume '/no/such/ckpt'", "no such checkpoint", "'auto'"]),
]


@pytest.mark.parametrize("args,needles", CLI_IN_PROCESS, ids=[" ".join(args) for args, _ in CLI_IN_PROCESS])
def test_cli_flag_errors_in_process(args, needles):
    raises_user_error(lambda: parse_config(args), *needles)


def test_global_batch_not_divisible_by_processes():
    from accel_train.data.pipeline import plan_batches

    raises_user_error(
        lambda: plan_batches(4, 32, 1, global_batch_size=30),
        "--global-batch-size 30 is not divisible by the 4 processes",
        "use a multiple of 4",
    )


@pytest.mark.parametrize(
    "text,needles",
    [
        ("colour: red\n", ["unknown key 'colour'", "--help flags without '--'"]),
        ("lr_schedule: off\n", ["lr_schedule: off was read as False", "quote it: lr_schedule: 'off'"]),
        ("output_dir: 0001\n", ["output_dir: 0001 was read as 1", "quote it: output_dir: '0001'"]),
        ("epochs: many\n", ["epochs must be a number, got 'many'"]),
        ("epochs: 2.5\n", ["epochs must be an integer, got 2.5"]),
        ("lr: [1]\n", ["lr must be a number, got [1]"]),
        ("download: maybe\n", ["download must be true or false, got 'maybe'"]),
        ("batch_size:\n", ["batch_size needs a value"]),
        ("- lr: 0.1\n- epochs: 2\n", ["expected a mapping of key: value, got list"]),
        ("lr: 0.1\n  epochs: 3\n", ["not valid YAML at line 2, column 9", "mapping values are not allowed", "quoting"]),
        ("epochs: [1\n", ["not valid YAML at line 2", "key: value"]),
    ],
    ids=[
        "unknown-key-no-suggestion",
        "unquoted-off",
        "leading-zeros",
        "epochs-many",
        "epochs-float",
        "lr-list",
        "bool-maybe",
        "missing-value",
        "not-a-mapping",
        "bad-indent",
        "unclosed-list",
    ],
)
def test_yaml_config_errors_in_process(tmp_path, text, needles):
    config = tmp_path / "hp.yaml"
    config.write_text(text)
    before = snapshot(tmp_path)
    message = raises_user_error(lambda: parse_config(["--config", str(config)]), str(config), *needles)
    assert message.startswith(f"--config {config}")
    assert snapshot(tmp_path) == before


def test_yaml_config_missing_or_binary_file(tmp_path):
    raises_user_error(lambda: parse_config(["--config", str(tmp_path / "nope.yaml")]), "nope.yaml", "file not found")
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(b"\x80\x02\x00\xff" * 16)
    raises_user_error(lambda: parse_config(["--config", str(binary)]), str(binary), "UTF-8", "pass a YAML file")


def test_resume_from_a_folder_that_is_not_a_checkpoint_in_process(tmp_path):
    from accel_train.checkpoint.state import resolve_resume

    target = tmp_path / "notes"
    target.mkdir()
    (target / "README.txt").write_text("not a checkpoint\n")
    before = snapshot(tmp_path)
    raises_user_error(lambda: resolve_resume(str(target), tmp_path / "run"), *not_a_checkpoint_needles(target))
    assert snapshot(tmp_path) == before


def test_the_malicious_payload_is_real(tmp_path):
    """Guard for the two cases above: plain pickle DOES run the payload, so 'no marker' means refused."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_output_dir_that_is_a_file_in_process(tmp_path):
    from accel_train.run_dir import RunDir

    blocker = tmp_path / "somefile"
    blocker.write_text("I am a file\n")
    before = snapshot(tmp_path)
    cfg = parse_config(["--output-dir", str(blocker)])
    needle = f"--output-dir {blocker} is not writable (it is a file)"
    raises_user_error(lambda: RunDir(cfg.output_dir).check(cfg.resume, cfg.overwrite), needle)
    assert snapshot(tmp_path) == before
