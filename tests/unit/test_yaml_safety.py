"""``--config FILE.yaml`` is safe to read: duplicate keys, alias bombs, huge files and huge values are refused.

All but one case run in-process (``load_yaml_config`` / ``parse_config``); one subprocess proves the
one-line ``error:`` format and exit code 2 for an alias bomb through ``scripts/train.py``.


The in-process tests; whole runs and launches are in ../integration/test_yaml_safety_runs.py.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from helpers_yaml_safety import billion_laughs, write

from accel_train.cli import run_main
from accel_train.config import TrainConfig, parse_config
from accel_train.config_yaml import YAML_MAX_BYTES, load_yaml_config
from accel_train.errors import UserError


def refused(path: Path, *needles: str) -> str:
    """``load_yaml_config(path, TrainConfig)`` raises a one-line, short UserError naming the file and every needle."""
    with pytest.raises(UserError) as info:
        load_yaml_config(path, TrainConfig)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600, message[:2000]
    assert message.startswith(f"--config {path}"), message
    for needle in needles:
        assert needle in message, f"{needle!r} missing from: {message}"
    return message


def test_duplicate_top_level_key_refused(tmp_path):
    path = write(tmp_path, "lr: 0.1\nepochs: 2\nlr: 0.1\n")
    refused(path, "key 'lr' appears twice", "lines 1 and 3", "keep one")
    with pytest.raises(UserError, match="appears twice"):
        parse_config(["--config", str(path)])


def test_duplicate_key_spellings_and_nesting_refused(tmp_path):
    refused(write(tmp_path, "batch-size: 4\nbatch_size: 8\n"), "'batch_size' appears twice", "'batch-size'")
    refused(write(tmp_path, "{lr: 0.1, lr: 0.2}\n"), "key 'lr' appears twice", "line 1")
    refused(write(tmp_path, "lr: {a: 1, a: 2}\n"), "key 'a' appears twice")


def test_distinct_keys_and_merge_keys_still_load(tmp_path):
    assert load_yaml_config(write(tmp_path, "lr: 0.1\nepochs: 2\noptimizer: 'no'\n"), TrainConfig) == {
        "lr": 0.1,
        "epochs": 2,
        "optimizer": "no",
    }
    assert load_yaml_config(write(tmp_path, ""), TrainConfig) == {}


@pytest.mark.parametrize(
    "text",
    [
        billion_laughs(),
        billion_laughs(final_key="lr"),
        billion_laughs(key="lr"),  # anchors hang off one repeated key
        billion_laughs(key="epochs", final_key="lr"),
    ],
    ids=["plain", "final-on-lr", "repeated-key", "repeated-key-final-on-lr"],
)
def test_alias_bomb_refused_fast_and_small(tmp_path, text):
    path = write(tmp_path, text)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(UserError) as info:
            parse_config(["--config", str(path)])
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "anchors/aliases expand too far" in message and "\n" not in message and len(message) < 600, message
    assert elapsed < 10, f"took {elapsed:.2f}s"  # liveness, not speed: an expanded bomb takes minutes
    assert peak < 100 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_alias_bomb_of_long_strings_refused(tmp_path):
    text = 'lr: &a "' + "x" * 900_000 + '"\nmodel: [' + ", ".join(["*a"] * 100) + "]\n"
    refused(write(tmp_path, text), "anchors/aliases expand too far", "characters")


def test_recursive_alias_and_deep_nesting_refused(tmp_path):
    refused(write(tmp_path, "lr: &a [1, *a]\n"), "refers to the collection that contains it")
    deep = "lr: " + "[" * 200_000 + "]" * 200_000 + "\n"
    start = time.perf_counter()
    refused(write(tmp_path, deep), "nest more than")
    assert time.perf_counter() - start < 10  # liveness: recursing 200,000 levels would not end this soon


def test_small_aliases_still_load(tmp_path):
    assert load_yaml_config(write(tmp_path, "lr: &x 0.5\nmomentum: *x\n"), TrainConfig) == {"lr": 0.5, "momentum": 0.5}


def test_file_over_1mib_refused_quickly(tmp_path):
    path = write(tmp_path, "lr: 0.1\n# " + "x" * YAML_MAX_BYTES + "\n")
    start = time.perf_counter()
    refused(path, "bytes is too large", f"{YAML_MAX_BYTES:,}")
    assert time.perf_counter() - start < 10  # liveness: refused from its size, not after parsing it


def test_nul_byte_refused(tmp_path):
    path = tmp_path / "hp.yaml"
    path.write_bytes(b"lr: 0.1\nepochs: 2\x00\n")
    refused(path, "NUL byte on line 2")


def test_utf8_bom_accepted(tmp_path):
    path = tmp_path / "hp.yaml"
    path.write_bytes(b"\xef\xbb\xbflr: 0.1\nepochs: 2\n")
    assert load_yaml_config(path, TrainConfig) == {"lr": 0.1, "epochs": 2}


def test_huge_value_for_numeric_key_gives_short_message(tmp_path):
    message = refused(write(tmp_path, 'lr: "' + "x" * 100_000 + '"\n'), "lr must be a number", "100,000 characters")
    assert len(message) < 300, message


def test_huge_values_and_keys_give_short_messages(tmp_path):
    refused(write(tmp_path, "seed: " + "1" * 5000 + "\n"), "not valid YAML at line 1", "5,000 characters")
    refused(write(tmp_path, "? " + "x" * 100_000 + "\n: 1\n"), "unknown key 'xxx", "100,000 characters")
    refused(write(tmp_path, "model: [" + ", ".join(["1"] * 5000) + "]\n"), "model takes one value")
    refused(write(tmp_path, "download: [" + ", ".join(["1"] * 5000) + "]\n"), "download must be true or false")


def test_run_main_caps_error_line(capsys):
    def main(argv):
        raise UserError("x" * 100_000)

    with pytest.raises(SystemExit) as info:
        run_main(main, [])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err[:300]
    line = err.rstrip("\n")
    assert line.startswith("error: xxx") and len(line) <= 2100, len(line)
    assert "more characters; rerun with --debug for the full text" in line


def test_run_main_keeps_short_error_line(capsys):
    def main(argv):
        raise UserError("--lr must be a positive number, got 0")

    with pytest.raises(SystemExit):
        run_main(main, [])
    assert capsys.readouterr().err == "error: --lr must be a positive number, got 0\n"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("epochs: 1:30\n", ("epochs must be a number", "'1:30'")),  # sexagesimal: was 90, silently
        ("lr: 1:30.5\n", ("lr must be a number", "'1:30.5'")),  # sexagesimal float: was 90.5
        ("output_dir: !!binary aGVsbG8=\n", ("output_dir is binary data",)),  # was the folder "b'hello'"
        ("output_dir: 2024-01-01 10:00:00\n", ("output_dir", "not as text", "quote it")),  # a datetime
        ("image_column: on\n", ("image_column", "read as True", "quote it")),
    ],
)
def test_yaml_1_1_conversions_are_refused_not_silent(tmp_path, text, needles):
    refused(write(tmp_path, text), *needles)


def test_text_with_a_colon_stays_as_written(tmp_path):
    assert load_yaml_config(write(tmp_path, "output_dir: 1:30\n"), TrainConfig) == {"output_dir": "1:30"}
    assert load_yaml_config(write(tmp_path, "output_dir: runs/10:30:00\n"), TrainConfig) == {
        "output_dir": "runs/10:30:00"
    }


@pytest.mark.parametrize("tag", ["python/object/apply:os.mkdir", "python/object/new:os.mkdir", "python/name:os.mkdir"])
def test_python_tags_are_refused_and_never_run(tmp_path, tag):
    """A config file is data: a tag that would call Python (PyYAML's full Loader runs it) is refused, unrun."""
    planted = tmp_path / "ran"
    path = write(tmp_path, f"lr: 0.1\noutput_dir: !!{tag} [{str(planted)!r}]\n")
    refused(path, "line 2", tag.split(":")[0])  # where, and which tag: the safe loader knows no constructor for it
    assert not planted.exists(), "the YAML file ran code"
