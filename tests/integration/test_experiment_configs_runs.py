"""configs/*.yaml: the seed experiments as hyperparameter files for ``--config``.

Each file parses to the seed's hyperparameters, and each really trains: two optimizer
steps on synthetic stand-in data of the same shape (1x28x28, 10 classes).


Whole runs and launches; the in-process tests are in ../unit/test_experiment_configs.py.
"""

from __future__ import annotations

import pytest
from conftest import FAST, check, metrics, run_here, summary
from helpers_experiment_configs import CONFIG_DIR, EXPECTED

from accel_train.config import parse_config

# synthetic stand-in with the seeds' data shape; small, because mnist_cnn has a 25088x1024 layer
SYNTHETIC = [
    "--dataset",
    "synthetic",
    "--synthetic-size",
    "256",
    "--synthetic-test-size",
    "64",
    "--synthetic-channels",
    "1",
    "--synthetic-image-size",
    "28",
    "--synthetic-classes",
    "10",
]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_parses_to_the_seed_hyperparameters(name):
    path = CONFIG_DIR / name
    text = path.read_text()
    assert text.startswith("#"), "a comment header says which seed this is and how to launch it"
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "seed 00" in header and "accelerate launch" in header and "--config" in header
    cfg = parse_config(["--config", str(path)])
    for key, value in EXPECTED[name].items():
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert getattr(cfg, key) == expected, (key, getattr(cfg, key))
    assert 1 <= cfg.epochs <= 20
    # flags override the file
    assert parse_config(["--config", str(path), "--lr", "0.5", "--batch-size", "8"]).lr == 0.5
    assert parse_config(["--config", str(path), "--batch-size", "8"]).batch_size == 8


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_trains_two_steps_on_synthetic_data(tmp_path, name):
    out = tmp_path / "run"
    proc = check(
        run_here(
            "train.py",
            "--config",
            str(CONFIG_DIR / name),
            *SYNTHETIC,
            "--max-steps",
            "2",
            "--batch-size",
            "16",
            "--no-checkpoint-epochs",
            "--threads",
            "1",
            "--output-dir",
            str(out),
            *FAST,
        )
    )
    s = summary(out)
    assert s["global_step"] == 2
    assert s["global_batch"] == 16
    assert s["eval_samples"] == 64
    expected = EXPECTED[name]
    assert f"{expected['model']} on synthetic" in proc.stdout
    resolved = (out / "config.yaml").read_text()
    assert f"model: {expected['model']}" in resolved
    assert f"optimizer: {expected['optimizer']}" in resolved


def test_mnist_speedrun_recipe_learns_mnist_format_digits_in_its_three_epochs(tmp_path):
    """configs/mnist_speedrun.yaml (the benchmark races pytorch/examples with it): on 2,000 synthetic MNIST-shaped
    digits in IDX files, its 3 epochs of batch 64 reach 95% (96.1% measured), in channels_last, evaluating every 50
    steps and at each epoch end. A recipe that stopped learning (an LR off by 100x, a lost schedule) fails here
    before it fails the benchmark."""
    from benchmarks.speed.mnist_rival import write_synthetic_mnist

    data = write_synthetic_mnist(tmp_path / "data", 2000, 1000)
    out = tmp_path / "run"
    args = ["--config", str(CONFIG_DIR / "mnist_speedrun.yaml"), "--data-dir", str(data), "--output-dir", str(out)]
    check(run_here("train.py", *args, *FAST))
    s = summary(out)
    assert (s["global_step"], s["global_batch"]) == (93, 64)  # 3 epochs of 31 full batches
    assert s["eval_accuracy"] >= 0.95, s["eval_accuracy"]
    resolved = (out / "config.yaml").read_text()
    assert "channels_last: true" in resolved and "label_smoothing: 0.1" in resolved
    evals = [m["step"] for m in metrics(out) if m["event"] == "eval"]
    assert evals == [31, 50, 62, 93]
