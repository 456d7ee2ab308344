"""The second red-team round on the generic task (any model, any task), as whole runs of ``accel_train.train``.

Tiny models on a few dozen samples, in this process; the two-process run launches tests/task_redteam2_train.py
under multi_cpu.yaml. Each test names the finding it covers (R2-nn). Scores are checked against scikit-learn on
the exported weights loaded into a fresh module.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import task_redteam_train as rt
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, launch_cmd, metrics, summary, weights
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

import accel_train
from accel_train.doctor.launching import child_env
from accel_train.errors import UserError
from accel_train.tasks.scores import Scores

SCRIPT = str(REPO / "tests" / "task_redteam2_train.py")


def _train(model, train, test, out: Path, **options) -> dict:
    return accel_train.train(model, train, test, output_dir=str(out), **{**rt.BASE, **options})


def _refused_untrained(out: Path, model, train, test, **options) -> UserError:
    """Refused with a UserError before any step trains: no checkpoint, no train record."""
    with pytest.raises(UserError) as info:
        _train(model, train, test, out, **{"log_every": 1, **options})
    assert not (out / "checkpoints").exists()
    assert not (out / "metrics.jsonl").exists() or not [r for r in metrics(out) if r["event"] == "train"]
    return info.value


def _fresh(make, run: Path) -> nn.Module:
    model = make()
    model.load_state_dict(weights(run), strict=True)
    return model.eval()


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _binary(n: int = 96):
    x = rt.features(n)
    return x, (x[:, 0] > 0).long()


# --------------------------------------------------------------------------- R2-01 keyed reading and the epoch


class _Recorded(Dataset):
    """torch.rand noise in __getitem__; every draw recorded per sample index (num_workers=0: in this process)."""

    def __init__(self, x, y):
        self.x, self.y, self.drawn = x, y, {}

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = torch.rand(4)
        self.drawn.setdefault(int(i), []).append(tuple(noise.tolist()))
        return self.x[i] + 0.1 * noise, self.y[i]


_KEYED = dict(global_batch_size=4, max_device_batch=1, max_steps=8, num_workers=0, eval_every=0)


def test_keyed_reading_draws_other_noise_in_every_epoch(tmp_path):
    """R2-01: 8 samples, 2 steps an epoch, 4 epochs at a micro-batch of 1: each sample's augmentation differs from
    epoch to epoch (it was seeded from the sample's index alone: the same "random" noise every epoch)."""
    x, y = _binary(12)
    data = _Recorded(x[:8], y[:8])
    _train(lambda: nn.Linear(4, 2), data, TensorDataset(x[8:], y[8:]), tmp_path, **_KEYED)
    assert sorted(data.drawn) == list(range(8))
    distinct = {i: len(set(draws)) for i, draws in data.drawn.items()}
    assert all(n >= 4 for n in distinct.values()), distinct  # >= one draw per epoch (identity reads come on top)


def test_keyed_reading_with_the_epoch_stops_and_resumes_as_a_straight_run(tmp_path):
    """R2-01: the epoch in the key survives a stop mid-run: stop at 3 (mid-epoch) + resume = straight (bits)."""
    x, y = _binary(12)

    def go(out, **options):
        return _train(lambda: nn.Linear(4, 2), _Recorded(x[:8], y[:8]), TensorDataset(x[8:], y[8:]), out,
                      **{**_KEYED, "checkpoint_every": 1, **options})  # fmt: skip

    go(tmp_path / "straight")
    go(tmp_path / "stopped", stop_at_step=3)
    assert go(tmp_path / "stopped", resume="auto")["global_step"] == 8
    assert _same_weights(tmp_path / "straight", tmp_path / "stopped")


# --------------------------------------------------------------------------- R2-02 monitor direction


def _metric(p, r):
    return 0.0


@pytest.mark.parametrize("name, higher", [("neg_mse", True), ("neg_log_loss", True), ("neg_mean_squared_error", True),
                                          ("top1_err", False), ("top5_err", False), ("mse", False)])  # fmt: skip
def test_monitor_direction_of_negated_scores_and_error_rates(name, higher):
    """R2-02: scikit-learn's neg_* scorers are higher-is-better; top1_err (pycls' naming) is lower-is-better."""
    assert Scores({name: _metric}).higher is higher
    assert Scores({name: _metric}, monitor=name).higher is higher


# --------------------------------------------------------------------------- R2-03 classes from the logits


@pytest.mark.parametrize("classes", [5, 3], ids=["class-4-missing-from-train", "train-has-only-0-and-1"])
def test_f1_averages_over_the_models_logits_not_the_train_labels(tmp_path, classes):
    """R2-03: the run's classes are the model's logit width: eval_f1 is scikit-learn's macro F1 over all of them,
    though the train split lacks the last class (with 3 logits and train labels 0/1 it took a binary F1)."""
    from sklearn.metrics import f1_score

    g = torch.Generator().manual_seed(0)
    xe, ye = torch.randn(40, 6, generator=g), torch.arange(40) % classes
    xt = torch.randn(64, 6, generator=g)
    yt = torch.arange(64) % (classes - 1)
    s = _train(lambda: nn.Linear(6, classes), TensorDataset(xt, yt), TensorDataset(xe, ye), tmp_path,
               metrics=["f1"], max_steps=4, eval_every=0)  # fmt: skip
    with torch.no_grad():
        pred = _fresh(lambda: nn.Linear(6, classes), tmp_path)(xe).argmax(-1).numpy()
    want = f1_score(ye.numpy(), pred, average="macro", labels=list(range(classes)), zero_division=0)
    assert s["eval_f1"] == pytest.approx(float(want), abs=1e-12)


# --------------------------------------------------------------------------- R2-04 probabilities are not logits


def test_a_predict_fn_giving_probabilities_for_class_labels_is_refused(tmp_path):
    """R2-04: predict_fn=sigmoid gives float predictions for integer labels: refused before training, naming
    predict_fn (they were scored against the labels without a word)."""
    x, y = _binary()
    error = _refused_untrained(tmp_path, lambda: nn.Linear(4, 1), TensorDataset(x[:64], y[:64]),
                               TensorDataset(x[64:], y[64:]),
                               predict_fn=lambda o, b: torch.sigmoid(o[:, 0]))  # fmt: skip
    assert "predict_fn" in str(error)


def test_a_model_ending_in_sigmoid_gets_a_note_naming_predict_fn(tmp_path, capsys):
    """R2-04: a one-output model ending in nn.Sigmoid, trained with BCELoss: predictions 'output > 0' are always 1;
    the run says so and names predict_fn."""
    x, y = _binary()

    def bce(outputs, batch):
        return F.binary_cross_entropy(outputs[:, 0], batch[-1].float())

    _train(lambda: nn.Sequential(nn.Linear(4, 1), nn.Sigmoid()), TensorDataset(x[:64], y[:64]),
           TensorDataset(x[64:], y[64:]), tmp_path, loss_fn=bce)  # fmt: skip
    assert "predict_fn" in capsys.readouterr().out


# --------------------------------------------------------------------------- R2-05 multi-label targets


def test_multi_label_integer_targets_are_refused_naming_loss_fn(tmp_path):
    """R2-05: [B, 3] 0/1 integer targets on [B, 3] logits: one line naming loss_fn (the advice was to make them
    float, which trains an MSE regression on the logits)."""
    x = rt.features(64)
    y = (x[:, :3] > 0).long()
    error = _refused_untrained(tmp_path, lambda: nn.Linear(4, 3), TensorDataset(x[:48], y[:48]),
                               TensorDataset(x[48:], y[48:]))  # fmt: skip
    assert "loss_fn" in str(error)


# --------------------------------------------------------------------------- R2-06 a dataset's own generator


class _OwnGenerator(Dataset):
    def __init__(self, x, y, kind):
        self.x, self.y, self.kind = x, y, kind
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.kind == "numpy":
            noise = torch.from_numpy(self.rng.standard_normal(4).astype("float32"))
        else:
            noise = torch.from_numpy(np.frombuffer(os.urandom(16), dtype=np.uint32).astype("float32") / 2**32)
        return self.x[i] + 0.3 * noise, self.y[i]


@pytest.mark.parametrize("kind", ["numpy", "urandom"])
def test_a_dataset_drawing_from_its_own_generator_gets_a_note_and_resumes(tmp_path, capsys, kind):
    """R2-06: np.random.default_rng(0) kept on the dataset, or os.urandom: generators the keyed reading cannot seed.
    The run says its draws give other values, and its resume is not refused as other data."""
    x, y = _binary(48)

    def go(**options):
        return _train(lambda: nn.Linear(4, 2), _OwnGenerator(x[:32], y[:32], kind), TensorDataset(x[32:], y[32:]),
                      tmp_path, max_steps=8, checkpoint_every=2, eval_every=4, **options)  # fmt: skip

    go(stop_at_step=4)
    assert "other values" in capsys.readouterr().out
    assert go(resume="auto")["global_step"] == 8
    assert [r["step"] for r in metrics(tmp_path) if r["event"] == "resume"] == [4]


# --------------------------------------------------------------------------- R2-07, R2-08 which path


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 2))  # fmt: skip


@pytest.mark.parametrize("shape", [(64, 1, 7, 7), (64, 7, 7)], ids=["uint8-1x7x7", "uint8-7x7"])
def test_tiny_uint8_images_train_on_the_image_path(tmp_path, shape):
    """R2-07: uint8 [N, 1, 7, 7] and [N, 7, 7] digits (downsampled) are images, as before the generic task took
    small inputs to the model as they are: the run trains on the image path (resolved task None)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    y = (x.float().flatten(1).mean(1) > 127.5).long()
    s = _train(_cnn(), TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:]), tmp_path, max_steps=4,
               eval_every=0)  # fmt: skip
    assert s["global_step"] == 4 and summary(tmp_path)["global_step"] == 4
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert "task" in config["resolved"] and config["resolved"]["task"] is None


def test_a_standardised_series_goes_to_the_model_as_it_is(tmp_path):
    """R2-08: [16, 12] float series (standardised: negative values) with class labels: not an image ([H, W] with
    sides >= 8): the model gets [B, 16, 12] tensors equal to the dataset's."""
    x = torch.randn(64, 16, 12, generator=torch.Generator().manual_seed(0))
    y = (x[:, :, 0].mean(1) > 0).long()
    seen = []

    class Series(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16 * 12, 2)

        def forward(self, inputs):
            seen.append(inputs.detach().clone())
            return self.head(inputs.flatten(1))

    s = _train(Series(), TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:]), tmp_path, max_steps=4)
    assert s["global_step"] == 4
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["resolved"]["task"]["task"] == "classification"
    assert seen and all(b.shape[1:] == (16, 12) for b in seen)
    assert all(any(torch.equal(row, ref) for ref in x) for b in seen for row in b)  # the values themselves


# --------------------------------------------------------------------------- R2-09 datasets.Dataset columns


def test_a_resume_on_other_set_format_columns_is_refused(tmp_path):
    """R2-09: stopped on set_format("torch", columns=["x1", "label"]), resumed on columns=["x2", "label"]: other
    inputs to the model, refused (it resumed on them)."""
    datasets = pytest.importorskip("datasets")
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(48, 4, generator=g), 100 * torch.randn(48, 4, generator=g)
    y = (x1[:, 0] > 0).long()

    def part(lo, hi, column):
        d = datasets.Dataset.from_dict({"x1": x1[lo:hi].tolist(), "x2": x2[lo:hi].tolist(), "label": y[lo:hi].tolist()})
        d.set_format("torch", columns=[column, "label"])
        return d

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, **batch):
            return self.lin(next(v for k, v in batch.items() if k != "label"))

    def go(column, **options):
        return _train(M, part(0, 32, column), part(32, 48, column), tmp_path, max_steps=8, checkpoint_every=2,
                      eval_every=4, **options)  # fmt: skip

    go("x1", stop_at_step=4)
    with pytest.raises(UserError):
        go("x2", resume="auto")
    saved = [int(p.name.split("_")[-1]) for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert max(saved) == 4  # the refused resume trained nothing


# --------------------------------------------------------------------------- R2-10 random collate at evaluation


def _masking(samples):
    inputs, target = default_collate(samples)
    return inputs * (torch.rand(inputs.shape) > 0.3).float(), target


def test_a_collate_drawing_random_numbers_at_evaluation_gets_a_note(tmp_path, capsys):
    """R2-10: random masking in the collate_fn also masks the eval batches (not keyed): the run says the
    evaluation draws random numbers; the same run with a collate that draws none does not."""
    x, y = _binary(64)
    data, test = TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])
    _train(lambda: nn.Linear(4, 2), data, test, tmp_path / "plain", collate_fn=default_collate, max_steps=4)
    assert "evaluation" not in capsys.readouterr().out
    _train(lambda: nn.Linear(4, 2), data, test, tmp_path / "masked", collate_fn=_masking, max_steps=4)
    assert "evaluation" in capsys.readouterr().out


# --------------------------------------------------------------------------- R2-11 a refusal on one rank only


def test_a_monitor_typo_with_one_eval_sample_on_two_processes_is_one_line(tmp_path):
    """R2-11: one eval sample on two processes (rank 0's block is empty, so its check before the run saw no batch)
    and a monitor no metric gives: the launch fails on the refusal naming the monitor, not on a lost peer."""
    cmd = launch_cmd(SCRIPT, str(tmp_path), "monitor_one_eval", config="multi_cpu.yaml")
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert any("error:" in line and "monitor" in line for line in output.splitlines()), output[-3000:]
    assert "Connection closed by peer" not in output, output[-3000:]
    assert not (tmp_path / "monitor_one_eval" / "checkpoints").exists()


# --------------------------------------------------------------------------- round 3: tied weights


class _Tied(nn.Module):
    """Two layers sharing one weight, as a language model ties its embeddings and its output layer."""

    def __init__(self):
        super().__init__()
        self.encode = nn.Linear(4, 4)
        self.decode = nn.Linear(4, 4)
        self.decode.weight = self.encode.weight

    def forward(self, x):
        return self.decode(torch.relu(self.encode(x)))


def test_a_model_with_tied_weights_checkpoints_and_resumes_as_a_straight_run(tmp_path):
    """Tied weights made every checkpoint fail (safetensors refuses shared tensors): the run was lost at its first
    save. Now: stop + resume equal a straight run, and the resumed model's layers still share their weight."""
    x = rt.features(64)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    train, test = TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])

    def go(out, **options):
        return accel_train.train(_Tied, train, test, output_dir=str(out), **{**rt.BASE, "max_steps": 8, **options})

    go(tmp_path / "straight", checkpoint_every=2)
    go(tmp_path / "stopped", checkpoint_every=2, stop_at_step=4)
    assert go(tmp_path / "stopped", checkpoint_every=2, resume="auto")["global_step"] == 8
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh = _Tied()
    fresh.load_state_dict(b, strict=True)
    assert fresh.decode.weight is fresh.encode.weight


# --------------------------------------------------------------------------- round 3: another loss on resume


def _l1(outputs, batch):
    return F.l1_loss(outputs.squeeze(-1), batch[-1])


def test_a_resume_with_another_loss_fn_is_refused_and_the_same_one_resumes(tmp_path):
    """eval_loss is the loss's value: a resume with another loss_fn would compare an L1 with the MSE best."""
    x = rt.features(64)
    y = x @ rt.TRUE_W
    train, test = TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])

    def go(out, **options):
        return accel_train.train(
            lambda: nn.Linear(4, 1), train, test, output_dir=str(out), **{**rt.BASE, "max_steps": 8, **options}
        )

    go(tmp_path / "mse", stop_at_step=4)
    with pytest.raises(UserError) as info:
        go(tmp_path / "mse", resume="auto", loss_fn=_l1)
    assert "loss_fn" in str(info.value)
    go(tmp_path / "l1", stop_at_step=4, loss_fn=_l1)
    assert go(tmp_path / "l1", resume="auto", loss_fn=_l1)["global_step"] == 8


# --------------------------------------------------------------------------- round 3: the image commands


def test_the_image_commands_refuse_a_generic_run_in_one_line(tmp_path):
    """accel-evaluate and accel-predict rebuild image classifiers: on a run of the generic task they died with a
    KeyError or a shape error, or named the image models; now one line says to load the weights into your model."""
    x = rt.features(64)
    y = (x[:, 0] > 0).long()
    out = tmp_path / "run"
    accel_train.train(lambda: nn.Linear(4, 2), TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:]),
                      output_dir=str(out), **rt.BASE)  # fmt: skip
    from accel_train.checkpoint import load_model

    with pytest.raises(UserError) as info:
        load_model(out / "model")
    assert "load_weights" in str(info.value)
    for command in ("accel-evaluate", "accel-predict"):
        args = [command, "--weights", str(out / "model")] + (["x.png"] if command == "accel-predict" else [])
        done = subprocess.run(args, capture_output=True, text=True, env=child_env(), timeout=120)
        assert done.returncode != 0 and "load_weights" in done.stderr + done.stdout, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
