"""``accel_train/config.py`` (``TrainConfig``, ``parse_config``, ``build_parser``): --help, and flag and YAML values
refused before anything runs, one ``UserError`` line each (the catalogue of bad inputs: test_bad_inputs.py)."""

from __future__ import annotations

import pytest
from checks import raises_user_error, snapshot
from helpers_bad_inputs import deadline, fifo

from accel_train.config import build_parser, parse_config

# ---- --help: choices listed, each default once -----------------------------------------------------------------------


def test_help_lists_choices_and_each_default_once():
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    for choices in ("{cosine,constant,linear,step}", "{sgd,adam,adamw}"):
        assert f"{choices}" in text, choices
    # --report-to takes any of accelerate's trackers, comma-separated: a metavar, and the names in its help
    assert "--report-to TRACKERS trackers besides metrics.jsonl: tensorboard, csv, all" in text
    assert "mlflow, wandb" in text and "{tensorboard,csv,none,all}" not in text
    assert "resize images to this size (default: the dataset's own size) --val-split" in text
    assert "(default: cosine)" in text and "(default: 0.5,0.75)" in text
    for action in parser._actions:
        assert (action.help or "").count("(default:") <= 1, action.help
    assert text.count("(default:") == sum("(default:" in (a.help or "") for a in parser._actions)


# ---- flag and YAML values --------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("text", "expected"), [("true", "DEFAULT"), ("false", None), ("'IMAGENET1K_V1'", "IMAGENET1K_V1")]
)
def test_pretrained_true_in_yaml_is_the_flag_alone(tmp_path, text, expected):
    """``pretrained: true`` means what the bare ``--pretrained`` flag means (the default weights); it was refused
    with advice to quote it, and the quoted 'true' was then refused as no weights name."""
    path = tmp_path / "c.yaml"
    path.write_text(f"model: tv:resnet18\npretrained: {text}\n")
    cfg = parse_config(["--config", str(path)])
    assert cfg.pretrained == expected and cfg.model == "tv:resnet18"


def test_abbreviated_flags_are_refused_and_a_misspelled_one_gets_a_suggestion():
    """argparse took --epoch for --epochs silently (and any prefix of a flag); now it is unknown, with the flag it
    was probably meant to be, and a flag far from any gets no guess."""
    raises_user_error(
        lambda: parse_config(["--epoch", "3"]), "unrecognized arguments: --epoch 3", "did you mean --epochs?"
    )
    raises_user_error(lambda: parse_config(["--lr-schedul", "cosine"]), "did you mean --lr-schedule?")
    message = raises_user_error(lambda: parse_config(["--zzzz", "1"]), "unrecognized arguments: --zzzz")
    assert "did you mean" not in message
    assert parse_config(["--epochs", "3"]).epochs == 3


def test_dir_of_the_package_lists_its_api():
    import accel_train

    assert {"train", "load_model", "load_weights"} <= set(dir(accel_train))
