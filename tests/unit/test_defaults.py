"""``accel_train/defaults.py`` (the defaults chosen for the user's own data), ``models/small_cnn.py`` and
``memorisation.py`` (the end-of-run warning), in process; the runs are in ../integration/test_defaults_runs.py."""

from __future__ import annotations

import pytest
import torch
from checks import raises_user_error

from accel_train import defaults
from accel_train.config import parse_config
from accel_train.memorisation import memorisation_warning
from accel_train.models import create_model

BUILTIN = ["digits", "synthetic", "mnist", "fashion_mnist", "cifar10"]
OWN = ["imagefolder:some/dir", "hf:user/data", "shards:some/dir"]


def _picked(*flags: str):
    from accel_train.build import _with_defaults

    cfg = parse_config(list(flags))
    return cfg, *_with_defaults(cfg, fresh=True)


@pytest.mark.parametrize("dataset", BUILTIN)
def test_builtin_datasets_keep_their_recipe(dataset):
    """Nothing is chosen for a built-in dataset: the very same config object goes on (lenet, no augmentation
    change, the flag's 8 epochs), so its runs, parity and resume are what they were."""
    cfg, after, picked = _picked("--dataset", dataset)
    assert not picked and after is cfg
    assert (after.model, after.augment, after.epochs, after.channels_last) == ("lenet", None, 8, None)
    assert picked.epochs(8, 3) == 8  # nothing raised either


@pytest.mark.parametrize("dataset", OWN)
def test_own_data_without_a_model_gets_the_small_cnn_augmented_and_enough_steps(dataset):
    cfg, after, picked = _picked("--dataset", dataset)
    assert picked and after is not cfg
    assert (after.model, after.augment, after.channels_last) == (defaults.MODEL, True, True)
    assert picked.min_steps == defaults.MIN_STEPS == 500
    assert picked.epochs(after.epochs, 3) == 167  # 120 images at batch 32: 3 steps an epoch, 501 steps
    assert picked.epochs(after.epochs, 1000) == 8  # a big dataset keeps the flag's epochs
    assert after.given == cfg.given  # what the user set is still known
    line = picked.describe(167, 3)
    assert "\n" not in line and "--model small_cnn" in line and "--augment" in line and "501 steps" in line
    record = picked.record(167)
    assert record["model"] == defaults.MODEL and record["epochs"] == 167 and "no --model was given" in record["why"]


def test_what_the_user_sets_wins():
    """An explicit --model keeps today's recipe whole; --no-augment, --epochs, --max-steps and --no-channels-last
    each keep theirs while the rest is chosen."""
    folder = ["--dataset", "imagefolder:x"]
    _, after, picked = _picked(*folder, "--model", "lenet")
    assert not picked and (after.model, after.augment, after.epochs) == ("lenet", None, 8)
    _, after, picked = _picked(*folder, "--no-augment")
    assert after.model == defaults.MODEL and after.augment is False and picked.augment is None
    for length in (["--epochs", "3"], ["--max-steps", "7"]):
        _, after, picked = _picked(*folder, *length)
        assert (
            after.model == defaults.MODEL
            and picked.min_steps is None
            and picked.epochs(after.epochs, 3) == after.epochs
        )
    _, after, _ = _picked(*folder, "--no-channels-last")
    assert after.channels_last is False


def test_yaml_keys_count_as_given(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("dataset: imagefolder:x\nmodel: resnet18\n")
    _, after, picked = _picked("--config", str(path))
    assert not picked and after.model == "resnet18"


def test_data_given_in_code_gets_the_model_but_no_augmentation():
    """``accel_train.train`` given a dataset and no model (its data label is "custom"); a config built in
    code without ``given`` counts as every field set: nothing is chosen."""
    picked = defaults.choose("custom", {"dataset", "output_dir"})
    assert picked.model == defaults.MODEL and picked.augment is None and picked.min_steps == 500
    assert not defaults.choose("imagefolder:x", None)


def test_a_resume_chooses_nothing():
    from accel_train.build import _with_defaults

    cfg = parse_config(["--dataset", "imagefolder:x", "--resume", "auto"])
    after, picked = _with_defaults(cfg, fresh=False)
    assert not picked and after is cfg


def test_image_size_is_checked_against_the_model_the_run_builds():
    """lenet needs 14 pixels; a folder without --model builds small_cnn, which takes 8."""
    assert parse_config(["--dataset", "imagefolder:x", "--image-size", "8"]).image_size == 8
    raises_user_error(
        lambda: parse_config(["--dataset", "imagefolder:x", "--image-size", "8", "--model", "lenet"]),
        "--image-size 8 is too small for --model lenet",
    )


@pytest.mark.parametrize("size", [1, 8, 28, 47, 48, 64, 96])
def test_small_cnn_takes_any_size_and_ignores_the_background_colour(size):
    torch.manual_seed(0)
    model = create_model(defaults.MODEL, num_classes=3, in_channels=3, image_size=size).eval()
    x = torch.randn(2, 3, size, size)
    assert model(x).shape == (2, 3)
    shifted = x + torch.tensor([0.5, -1.0, 2.0]).view(1, 3, 1, 1)  # another background colour, the same shapes
    assert torch.allclose(model(x), model(shifted), atol=1e-5)


def test_small_cnn_finds_a_pattern_wherever_it_is():
    """Global max pooling: the same object moved by a multiple of the network's stride gives the same logits."""
    torch.manual_seed(0)
    model = create_model(defaults.MODEL, num_classes=3, in_channels=1, image_size=64).eval()
    a, b = torch.zeros(1, 1, 64, 64), torch.zeros(1, 1, 64, 64)
    a[..., 16:24, 16:24] = 1.0
    b[..., 40:48, 32:40] = 1.0  # moved by (24, 16): multiples of 8, the stride of the last map; both far from edges
    la, lb = model(a), model(b)
    # relative to the logits' size, measured: 0.8% (the borders' zero padding; small_cnn with BatchNorm: 0.7%);
    # lenet: 42%
    assert (la - lb).abs().max() <= 0.02 * la.abs().max()


# ---- the memorisation warning ----------------------------------------------------------------------------------------


def _records(train: list[tuple[int, float, float]], evals: list[tuple[int, float, float]]) -> dict:
    """``(step, loss, accuracy)`` rows as ``run_records.read_metrics`` groups them."""
    return {
        "train": [{"step": s, "loss": loss, "accuracy": acc} for s, loss, acc in train],
        "eval": [{"step": s, "eval_loss": loss, "eval_accuracy": acc} for s, loss, acc in evals],
    }


# lenet, no augmentation, 40 epochs on the 120-image shapes folder (measured: seed 0 of benchmarks/data/own_folder.py)
MEMORISED = _records(
    [(10, 1.1, 0.4), (60, 0.2, 0.95), (120, 0.01, 1.0)], [(3, 1.17, 0.3), (30, 2.2, 0.37), (120, 5.37, 0.37)]
)
# small_cnn with the defaults on the same folder
GENERALISED = _records([(10, 1.0, 0.5), (250, 0.2, 0.93), (500, 0.05, 0.98)], [(3, 1.1, 0.33), (501, 0.12, 0.967)])


def test_memorisation_fires_on_a_memorised_run_and_says_what_to_try():
    line = memorisation_warning(MEMORISED, augmented=False, pretrained=False)
    assert line and "\n" not in line
    assert "training accuracy 1.00 vs evaluation accuracy 0.37" in line
    assert "evaluation loss rose from 1.17 (step 3) to 5.37 while training loss fell" in line
    assert "--augment" in line and "more training images" in line and "--pretrained" in line and "smaller" in line
    assert "--augment" not in memorisation_warning(MEMORISED, augmented=True, pretrained=True)
    assert "--pretrained" not in memorisation_warning(MEMORISED, augmented=True, pretrained=True)


def test_memorisation_stays_silent_on_runs_that_generalise_or_learnt_little():
    assert memorisation_warning(GENERALISED, augmented=True, pretrained=False) is None
    # lenet's 24 default steps on the folder: 50% vs 23% on three classes is little learnt, not memorised
    little = _records([(10, 1.0, 0.45), (20, 0.95, 0.5)], [(3, 1.17, 0.3), (12, 1.3, 0.27), (24, 1.4, 0.23)])
    assert memorisation_warning(little, augmented=False, pretrained=False) is None
    assert memorisation_warning({}, augmented=False, pretrained=False) is None  # nothing logged: nothing to say


def test_either_sign_alone_is_enough():
    gap_only = _records([(10, 0.05, 1.0)], [(10, 1.0, 0.6)])
    assert "training accuracy 1.00 vs evaluation accuracy 0.60" in memorisation_warning(gap_only, False, False)
    # eval loss 0.4 -> 1.0 while the train loss fell, the accuracies close (an overconfident model)
    rise_only = _records([(5, 0.9, 0.7), (30, 0.1, 0.9)], [(5, 0.4, 0.8), (15, 0.6, 0.8), (30, 1.0, 0.8)])
    line = memorisation_warning(rise_only, False, False)
    assert "evaluation loss rose from 0.40 (step 5) to 1.00" in line and "training accuracy" not in line
    # the same rise while the training loss rose too is a diverging run, not memorisation
    diverging = _records([(5, 0.5, 0.7), (30, 0.9, 0.7)], [(5, 0.4, 0.8), (15, 0.6, 0.8), (30, 1.0, 0.8)])
    assert memorisation_warning(diverging, False, False) is None


def test_a_near_perfect_run_is_not_memorisation():
    """The gap needs its absolute floor as well as the error ratio: 100% in training and 99% in evaluation is 2x the
    error (and infinitely more) but a run that learnt the task; so are 98% vs 95% and 100% vs 80%."""
    for train_acc, eval_acc in ((1.0, 0.99), (0.98, 0.95), (1.0, 0.8)):
        near = _records([(10, 0.5, 0.6), (100, 0.02, train_acc)], [(50, 0.3, 0.9), (100, 0.1, eval_acc)])
        assert memorisation_warning(near, augmented=True, pretrained=False) is None, (train_acc, eval_acc)
    assert "training accuracy 1.00 vs evaluation accuracy 0.37" in memorisation_warning(MEMORISED, True, False)


def test_the_steps_after_the_last_train_record_count_as_the_last_window():
    """--log-every longer than the run: no train record at all; the trainer's open window (all the steps) is
    judged. After a record, the open window counts only when it holds at least as many steps as the last logged
    window: one step left over after step 120 of --log-every 10 does not replace the last ten."""
    evals = [(3, 1.17, 0.3), (120, 5.37, 0.37)]
    whole_run = {"step": 120, "loss": 0.3, "accuracy": 0.9}
    assert memorisation_warning(_records([], evals), False, False) is None  # nothing to compare with
    line = memorisation_warning(_records([], evals), False, False, open_window=whole_run)
    assert "training accuracy 0.90 vs evaluation accuracy 0.37" in line
    logged = _records([(110, 1.0, 0.5), (120, 0.9, 0.55)], evals)  # learnt little: 55% vs 37% of three classes
    one_step = {"step": 121, "loss": 0.0, "accuracy": 1.0}
    assert memorisation_warning(logged, False, False, open_window=one_step) is None
    stale = _records([(10, 1.0, 0.5)], evals)  # a first attempt's record, then a resume with a longer --log-every
    assert "training accuracy 0.90" in memorisation_warning(stale, False, False, open_window=whole_run)
