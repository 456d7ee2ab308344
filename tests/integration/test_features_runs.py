"""Issue 14, item 3: EMA, label smoothing, mixup/cutmix, early stopping, keyed dropout, --max-device-batch auto.

Each feature keeps the parity promise (its randomness keyed on the sample, not the rank: the unit tests
below mix and drop out a global batch whole and in shards) and resumes exactly (the runs below stop and
resume with it on). The multi-process parity runs are in test_train_e2e.py.


Whole runs and launches; the in-process tests are in ../unit/test_features.py.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from conftest import copy_run, fit_small, metrics, summary, weights

from accel_train.errors import CheckpointError, UserError


def _bitwise(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _train_losses(run) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run) if m["event"] == "train"}


# mnist_cnn (dropout) on 64 samples, batch 16: 4 steps per epoch, so step 3 is mid-epoch and step 6 in epoch 1
FEATURES = [
    "--model", "mnist_cnn", "--synthetic-size", "64", "--synthetic-image-size", "8", "--max-steps", "6",
    "--ema", "0.8", "--mixup", "0.4", "--cutmix", "1.0", "--label-smoothing", "0.1", "--eval-every", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def feature_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    fit_small(root / "straight", *FEATURES)
    fit_small(root / "resumed", *FEATURES, "--stop-at-step", "3")
    stopped = copy_run(root / "resumed", root)  # the stopped run, kept for the corrupt-EMA check
    fit_small(root / "resumed", *FEATURES, "--resume", "auto")
    return root / "straight", root / "resumed", stopped


def test_resume_with_ema_mixing_smoothing_and_dropout_is_bitwise(feature_runs):
    straight, resumed, _ = feature_runs
    assert _bitwise(weights(straight), weights(resumed))
    assert _bitwise(weights(straight, "model_ema"), weights(resumed, "model_ema"))
    assert _train_losses(straight) == _train_losses(resumed) and len(_train_losses(straight)) == 6
    evals = [m for m in metrics(straight) if m["event"] == "eval"]
    assert evals and all("eval_ema_accuracy" in m and "eval_ema_loss" in m for m in evals)
    s = summary(straight)
    assert s["eval_ema_accuracy"] == summary(resumed)["eval_ema_accuracy"]
    assert not _bitwise(weights(straight), weights(straight, "model_ema"))  # the average is not the weights


def test_ema_export_loads_and_travels_in_verified_checkpoints(feature_runs):
    from accel_train.checkpoint.weights import load_model

    straight, _, stopped = feature_runs
    model, config = load_model(str(straight / "model_ema"))
    assert config["model"] == "mnist_cnn" and isinstance(model, nn.Module)
    checkpoint = stopped / "checkpoints" / "step_00000003"
    assert (checkpoint / "ema.safetensors").is_file()
    progress = json.loads((checkpoint / "progress.json").read_text())
    assert progress["state"]["extra"]["ema"] == {"decay": 0.8, "updates": 3}
    (checkpoint / "ema.safetensors").write_bytes((checkpoint / "ema.safetensors").read_bytes()[:100])
    with pytest.raises(CheckpointError, match="ema.safetensors is truncated or corrupt"):
        fit_small(stopped, *FEATURES, "--resume", "auto")


# --early-stop-min-delta 1: no accuracy ever beats the first by 1, so with an evaluation every step the
# run stops after the first evaluation plus two without improvement: at step 3 of the 20 planned
EARLY = ["--eval-every", "1", "--early-stop-patience", "2", "--early-stop-min-delta", "1", "--max-steps", "20"]


def test_early_stopping_stops_cleanly_and_resumes_to_the_same_step(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = fit_small(straight, *EARLY)
    s = summary(straight)
    assert result["global_step"] == s["global_step"] == 3
    assert s["stopped"].startswith("early stopping: eval_accuracy did not improve by more than 1 for 2 evaluations")
    assert (straight / "model" / "model.safetensors").is_file()
    progress = json.loads((straight / "checkpoints" / "step_00000003" / "progress.json").read_text())
    assert progress["state"]["extra"]["early_stop"]["bad_evals"] == 2

    fit_small(resumed, *EARLY, "--stop-at-step", "2")  # one evaluation without improvement so far
    fit_small(resumed, *EARLY, "--resume", "auto")
    assert summary(resumed)["global_step"] == 3 and summary(resumed)["stopped"] == s["stopped"]
    assert _bitwise(weights(straight), weights(resumed))

    fit_small(resumed, *EARLY, "--resume", "auto")  # an early-stopped run is complete: no step more
    assert summary(resumed)["global_step"] == 3
    fit_small(resumed, *EARLY, "--resume", "auto", "--early-stop-patience", "4")  # more patience: it goes on
    assert summary(resumed)["global_step"] == 5


def test_auto_micro_batch_keeps_the_global_batch(tmp_path, monkeypatch):
    """A simulated budget of 8 samples on CPU: global batch 32 becomes 8 x 4 accumulation steps, the same
    training as --max-device-batch 8 given by hand (and the probe leaves no trace in the weights)."""
    from accel_train.features import device_batch

    sizes: list[int] = []

    def probe_step(model, batch, *args):
        sizes.append(batch)
        if batch > 8:
            raise torch.OutOfMemoryError("simulated")
        device_batch.probe_step.__wrapped__(model, batch, *args)

    probe_step.__wrapped__ = device_batch.probe_step
    monkeypatch.setattr(device_batch, "probe_step", probe_step)
    args = ["--global-batch-size", "32", "--max-steps", "3", "--model", "mnist_cnn", "--synthetic-image-size", "8"]
    fit_small(tmp_path / "auto", *args, "--max-device-batch", "auto", "--stop-at-step", "2")
    auto = fit_small(tmp_path / "auto", *args, "--resume", "auto")  # the saved config says auto: probed again
    assert sizes == [32, 16, 8] * 2
    assert (auto["global_batch"], auto["micro_batch"], auto["accum_steps"]) == (32, 8, 4)
    fixed = fit_small(tmp_path / "fixed", *args, "--max-device-batch", "8")
    assert (fixed["micro_batch"], fixed["accum_steps"]) == (8, 4)
    assert _bitwise(weights(tmp_path / "auto"), weights(tmp_path / "fixed"))


def test_odd_micro_batch_with_mixup_is_refused(tmp_path):
    with pytest.raises(UserError, match="even micro-batch, got 15"):
        fit_small(tmp_path / "odd", "--batch-size", "15", "--cutmix", "1.0", "--max-steps", "1")
    assert not (tmp_path / "odd").exists()
