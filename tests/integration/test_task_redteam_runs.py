"""The red-team's findings on the generic task (any model, any task), as whole runs of ``accel_train.train``.

Tiny models on a few dozen samples, in this process; the two-process runs launch tests/task_redteam_train.py
(which also holds the models and data shared with these tests) under multi_cpu.yaml. Each test names the finding it
covers (Fnn). Values are checked against an independent computation: the exported weights loaded into a fresh
module and scored here, by scikit-learn where it has the metric.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import warnings
from pathlib import Path

import pytest
import task_redteam_train as rt
import torch
import torch.nn.functional as F
from conftest import REPO, check, launch_cmd, metrics, summary, weights
from torch import nn
from torch.utils.data import TensorDataset, default_collate

import accel_train
from accel_train.doctor.launching import child_env
from accel_train.errors import UserError

SCRIPT = str(REPO / "tests" / "task_redteam_train.py")


def _train(model, train, test, out: Path, **options) -> dict:
    return accel_train.train(model, train, test, output_dir=str(out), **{**rt.BASE, **options})


def _records(out: Path, event: str) -> list[dict]:
    return [r for r in metrics(out) if r["event"] == event]


def _refused_untrained(out: Path, model, train, test, **options) -> UserError:
    """The run is refused with a UserError before any step trains: no checkpoint, no train record, and a model
    given as an instance (trained in place) keeps its weights."""
    before = {k: v.clone() for k, v in model.state_dict().items()} if isinstance(model, nn.Module) else {}
    with pytest.raises(UserError) as info:
        _train(model, train, test, out, **{"log_every": 1, **options})  # a record from the first step on
    assert not (out / "checkpoints").exists()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not (out / "metrics.jsonl").exists() or not _records(out, "train")
    return info.value


def _fresh(cls, run: Path, sub: str = "model") -> nn.Module:
    model = cls()
    model.load_state_dict(weights(run, sub), strict=True)
    return model.eval()


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _binary():
    x = rt.features()
    return x, (x[:, 0] > 0).long()


def _regression():
    x = rt.features()
    return x, x @ rt.TRUE_W


# --------------------------------------------------------------------------- F01 one-logit binary classifier


def _bce(outputs, batch):
    return F.binary_cross_entropy_with_logits(outputs.squeeze(-1), batch[-1].float())


@pytest.mark.parametrize("loss_fn", [None, _bce], ids=["default-loss", "user-bce"])
def test_one_logit_binary_classifier_scores_logit_above_zero(tmp_path, loss_fn):
    """F01: nn.Linear(4, 1) on 0/1 labels: the prediction is logit > 0 (not the argmax of one column)."""
    x, y = _binary()
    s = _train(lambda: nn.Linear(4, 1), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path,
               loss_fn=loss_fn, metrics=["accuracy"], max_steps=40, eval_every=40, lr=0.5)  # fmt: skip
    with torch.no_grad():
        pred = (_fresh(lambda: nn.Linear(4, 1), tmp_path)(x[64:]).squeeze(-1) > 0).long()
    want = (pred == y[64:]).double().mean().item()
    assert s["eval_accuracy"] == pytest.approx(want, abs=1e-12)
    assert want > 0.8  # it trained (binary cross-entropy on the logit)


# --------------------------------------------------------------------------- F02 -100 labels in the metrics


def test_ignored_labels_are_left_out_of_the_eval_metrics(tmp_path):
    """F02: a quarter of the eval labels are -100: accuracy and F1 are scikit-learn's on the labelled samples."""
    from sklearn.metrics import f1_score

    x, y = _binary()
    y_eval = y[64:].clone()
    y_eval[::4] = -100
    s = _train(lambda: nn.Linear(4, 2), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y_eval), tmp_path,
               metrics=["accuracy", "f1"], max_steps=40, eval_every=40, lr=0.5)  # fmt: skip
    with torch.no_grad():
        pred = _fresh(lambda: nn.Linear(4, 2), tmp_path)(x[64:]).argmax(-1)
    keep = y_eval != -100
    p, r = pred[keep].numpy(), y_eval[keep].numpy()
    assert s["eval_accuracy"] == pytest.approx(float((p == r).mean()), abs=1e-12)
    assert s["eval_f1"] == pytest.approx(float(f1_score(r, p)), abs=1e-12)


def _separator() -> nn.Module:
    """Right on every sample of _binary() from the start (class 1 iff x[0] > 0), by a wide margin."""
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0], model.weight[1, 0] = -10.0, 10.0
        model.bias.zero_()
    return model


def test_ignored_labels_are_left_out_of_the_train_accuracy(tmp_path):
    """F02: a model right on every labelled sample logs a train accuracy of 1, however many labels are -100."""
    x, y = _binary()
    y_train = y[:64].clone()
    y_train[::4] = -100
    _train(_separator, TensorDataset(x[:64], y_train), TensorDataset(x[64:], y[64:]), tmp_path,
           metrics=["accuracy"], lr=0.01, log_every=1)  # fmt: skip
    train = _records(tmp_path, "train")
    assert train and all(r["accuracy"] == pytest.approx(1.0) for r in train), [r.get("accuracy") for r in train]


# --------------------------------------------------------------------------- F03, F09, F15 token classification


def _token_scores(run: Path, eval_rows: list[dict]) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over the labelled tokens, sentence by sentence, nothing padded."""
    model, right, total, nll = _fresh(rt.Tagger, run), 0, 0, 0.0
    with torch.no_grad():
        for row in eval_rows:
            logits, labels = model(row["input_ids"][None])["logits"][0], row["labels"]
            keep = labels != -100
            right += int((logits.argmax(-1)[keep] == labels[keep]).sum())
            total += int(keep.sum())
            nll += float(F.cross_entropy(logits[keep].double(), labels[keep], reduction="sum"))
    return right / total, nll / total


@pytest.fixture(scope="module")
def taggers(tmp_path_factory) -> dict[int, Path]:
    """The same tagger trained twice on one process, evaluated at eval_batch_size 4 and 16."""
    runs = {}
    for bs in (4, 16):
        out = tmp_path_factory.mktemp(f"tagger{bs}")
        rt.run(str(out), "tagger", eval_batch_size=bs, eval_every=4, log_every=1)
        runs[bs] = out / "tagger"
    return runs


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    """tests/task_redteam_train.py's cases on two processes (gloo)."""
    out = tmp_path_factory.mktemp("two")
    cmd = launch_cmd(SCRIPT, str(out), "noisy,tagger", config="multi_cpu.yaml")
    check(subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600))
    return out


def test_token_classification_scores_the_labelled_tokens_on_one_process(taggers):
    """F03: sentences padded per batch, -100 on padding: eval_accuracy is the accuracy over labelled tokens, at an
    eval batch smaller than the set (batches of other lengths)."""
    for bs, run in taggers.items():
        s = summary(run)
        assert s["eval_accuracy"] == pytest.approx(_token_scores(run, rt.tagged(16, 1))[0], abs=1e-9), bs
        assert [r["step"] for r in _records(run, "eval")] == [4, 8]


def test_token_classification_scores_the_labelled_tokens_on_two_processes(two):
    """F03: two ranks' blocks pad to other lengths; the gathered predictions are scored as on one process."""
    run = two / "tagger"
    s = summary(run)
    assert s["world_size"] == 2 and s["global_step"] == 8
    assert s["eval_accuracy"] == pytest.approx(_token_scores(run, rt.tagged(16, 1))[0], abs=1e-9)


def test_token_labels_give_a_train_accuracy_over_the_labelled_tokens(taggers):
    """F09: [B, T] labels: the train records' accuracy is the token accuracy (not a constant 0)."""
    train = _records(taggers[16], "train")
    accuracy = [r["accuracy"] for r in train]
    assert train and all(0.0 <= a <= 1.0 for a in accuracy)
    assert accuracy[-1] > 0.3  # three tags: trained past chance


def test_token_eval_loss_does_not_depend_on_the_eval_batch(taggers):
    """F15: the same weights score the same eval_loss at eval_batch_size 4 and 16: the mean over the labelled
    tokens (a batch's token mean weighted by its samples is not)."""
    assert _same_weights(taggers[4], taggers[16])  # eval batching changes nothing in training
    losses = {bs: [r["eval_loss"] for r in _records(run, "eval")] for bs, run in taggers.items()}
    assert losses[4] == pytest.approx(losses[16], abs=1e-6)
    assert summary(taggers[4])["eval_loss"] == pytest.approx(_token_scores(taggers[4], rt.tagged(16, 1))[1], abs=1e-5)


# --------------------------------------------------------------------------- F04, F18 randomness in the data


def test_random_getitem_starts_on_two_processes(two):
    """F04: jitter drawn in __getitem__ is not 'other samples on each process'."""
    s = summary(two / "noisy")
    assert s["world_size"] == 2 and s["global_step"] == 4


def _stop_resume_straight(tmp_path: Path, go) -> tuple[Path, Path]:
    """``go(out, **options)`` straight to step 8, and stopped at 4 then resumed: the two run folders."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    go(straight, max_steps=8, checkpoint_every=2)
    go(stopped, max_steps=8, checkpoint_every=2, stop_at_step=4)
    assert go(stopped, max_steps=8, checkpoint_every=2, resume="auto")["global_step"] == 8
    assert [r["step"] for r in _records(stopped, "resume")] == [4]
    return straight, stopped


def test_random_getitem_stop_and_resume_equal_a_straight_run(tmp_path):
    """F04: a dataset that draws torch.randn in __getitem__, one process: stop + resume = straight (bits)."""
    x, y = _binary()
    calls = itertools.count(1)

    def go(out, **options):
        torch.rand(next(calls))  # each call after other draws: the identity must not depend on them
        data, test = rt.Noisy(x[:32], y[:32]), TensorDataset(x[32:48], y[32:48])
        return _train(lambda: nn.Linear(4, 2), data, test, out, **options)

    assert _same_weights(*_stop_resume_straight(tmp_path, go))


def _masking(samples):
    inputs, target = default_collate(samples)
    return inputs * (torch.rand(inputs.shape) > 0.3).float(), target  # random masking, torch's generator


def test_random_collate_stop_and_resume_equal_a_straight_run(tmp_path):
    """F18: a collate_fn that draws torch.rand (random masking): stop + resume = straight (bits)."""
    x, y = _regression()

    def go(out, **options):
        return _train(lambda: nn.Linear(4, 1), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), out,
                      collate_fn=_masking, metrics=["mse"], **options)  # fmt: skip

    assert _same_weights(*_stop_resume_straight(tmp_path, go))


# --------------------------------------------------------------------------- F05, F11 datasets.Dataset


class _Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x, labels=None):
        return self.lin(x)


def _hf(x, y, transform=None):
    datasets = pytest.importorskip("datasets")

    data = datasets.Dataset.from_dict({"x": x.tolist(), "labels": y.tolist()})
    return data.with_transform(transform) if transform else data


def test_a_changed_with_transform_is_refused_on_resume(tmp_path):
    """F05: with_transform scaling the features by 1, then by 100 at the resume: other samples, refused."""
    x, y = _binary()

    def go(scale, **options):
        def transform(batch):
            return {"x": torch.tensor(batch["x"]) * scale, "labels": torch.tensor(batch["labels"])}

        data, test = _hf(x[:32], y[:32], transform), _hf(x[32:48], y[32:48], transform)
        return _train(_Features, data, test, tmp_path, max_steps=8, checkpoint_every=2, **options)

    go(1.0, stop_at_step=4)
    with pytest.raises(UserError):
        go(100.0, resume="auto")
    saved = [int(p.name.split("_")[-1]) for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert max(saved) == 4  # the refused resume trained nothing


def test_a_datasets_dataset_without_torch_format_is_refused_naming_set_format(tmp_path):
    """F11: samples of python lists and no collate_fn: one line that says set_format, before training."""
    x, y = _binary()
    error = _refused_untrained(tmp_path, _Features, _hf(x[:32], y[:32]), _hf(x[32:48], y[32:48]))
    assert "set_format" in str(error)


# --------------------------------------------------------------------------- F06, F13, F14 monitor and best/


def nll(predictions, references):
    """A Gaussian negative log-likelihood with unit variance: lower is better."""
    return 0.5 * ((predictions - references) ** 2).mean() + 0.9189


def foo(predictions, references):
    return ((predictions - references) ** 2).mean()


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)  # metrics.jsonl writes a NaN as null


def _best_by(out: Path, key: str, lower: bool) -> int:
    evals = [(r[key], r["step"]) for r in _records(out, "eval") if _finite(r[key])]
    return (min(evals) if lower else max(evals))[1]


def test_a_metric_named_nll_is_followed_as_lower_is_better(tmp_path):
    """F06: best/ holds the step of the smallest eval_nll, not the largest."""
    x, y = _regression()
    s = _train(lambda: nn.Linear(4, 1), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path,
               metrics=[nll], monitor="nll", max_steps=24, eval_every=4)  # fmt: skip
    assert s["best_step"] == _best_by(tmp_path, "eval_nll", lower=True) != 4
    assert s["best_eval_nll"] == min(r["eval_nll"] for r in _records(tmp_path, "eval"))


def test_a_monitor_of_unknown_direction_needs_monitor_mode(tmp_path):
    """F06: a callable metric named foo as the monitor: refused before training without monitor_mode; with
    monitor_mode="min" it trains and follows the smallest."""
    x, y = _regression()
    data, test = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    _refused_untrained(tmp_path / "a", lambda: nn.Linear(4, 1), data, test, metrics=[foo], monitor="foo")
    s = _train(lambda: nn.Linear(4, 1), data, test, tmp_path / "b", metrics=[foo], monitor="foo", monitor_mode="min")
    assert s["global_step"] == 6 and s["best_step"] == _best_by(tmp_path / "b", "eval_foo", lower=True)


def test_a_monitor_typo_is_refused_before_training_and_the_folder_stays_usable(tmp_path):
    """F13: monitor="acuracy" is refused when the run is built; the corrected call then runs in the same folder
    without overwrite=True."""
    x, y = _binary()
    data, test = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    _refused_untrained(tmp_path, lambda: nn.Linear(4, 2), data, test, metrics=["accuracy"], monitor="acuracy")
    s = _train(lambda: nn.Linear(4, 2), data, test, tmp_path, metrics=["accuracy"], monitor="accuracy")
    assert s["global_step"] == 6 and "eval_accuracy" in s


def test_a_dict_metric_without_monitor_is_refused_naming_monitor(tmp_path):
    """F13: a callable returning a dict has no eval_<name> to follow: refused when the run is built."""

    def scores(p, r):
        return {"acc": (p == r).float().mean(), "err": (p != r).float().mean()}

    x, y = _binary()
    error = _refused_untrained(tmp_path, lambda: nn.Linear(4, 2), TensorDataset(x[:64], y[:64]),
                               TensorDataset(x[64:], y[64:]), metrics=[scores])  # fmt: skip
    assert "monitor" in str(error)


def test_a_dict_of_shipped_metrics_logs_under_the_dicts_names(tmp_path):
    """F13: metrics={"val_f1": "f1", "acc": "accuracy"} logs eval_val_f1 and eval_acc (scikit-learn's values)."""
    from sklearn.metrics import f1_score

    x, y = _binary()
    s = _train(lambda: nn.Linear(4, 2), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path,
               metrics={"val_f1": "f1", "acc": "accuracy"})  # fmt: skip
    with torch.no_grad():
        p = _fresh(lambda: nn.Linear(4, 2), tmp_path)(x[64:]).argmax(-1).numpy()
    r = y[64:].numpy()
    assert s["eval_val_f1"] == pytest.approx(float(f1_score(r, p)), abs=1e-12)
    assert s["eval_acc"] == pytest.approx(float((p == r).mean()), abs=1e-12)
    assert all({"eval_val_f1", "eval_acc"} <= set(rec) for rec in _records(tmp_path, "eval"))


def test_a_metric_that_is_nan_at_the_first_evaluation_never_holds_best(tmp_path):
    """F14: NaN at the first evaluation, finite later: best/ follows the best finite value."""
    x, y = _regression()
    evaluations = []

    def pearson(p, r):
        if len(r) == 32:  # an evaluation of the whole set (not a probe of one batch)
            evaluations.append(1)
            if len(evaluations) == 1:
                return float("nan")  # e.g. a correlation of constant early predictions
        return torch.corrcoef(torch.stack([p.float().flatten(), r.float().flatten()]))[0, 1]

    s = _train(lambda: nn.Linear(4, 1), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path,
               metrics=[pearson], monitor_mode="max", max_steps=16, eval_every=4)  # fmt: skip
    evals = _records(tmp_path, "eval")
    assert not _finite(evals[0]["eval_pearson"]) and evals[0]["step"] == 4
    assert s["best_step"] == _best_by(tmp_path, "eval_pearson", lower=False) != 4


# --------------------------------------------------------------------------- F07, F12, F16, F20 shapes and types


class _Squeezed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)  # [B]


def test_column_targets_with_a_flat_output_train_to_the_true_weights(tmp_path):
    """F07: [N, 1] targets and a [B] output: an MSE per sample (no [B, B] broadcast) finds the true weights."""
    x, y = _regression()
    y = y[:, None]
    s = _train(_Squeezed, TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path, max_steps=150,
               eval_every=150, lr=0.1)  # fmt: skip
    learned = _fresh(_Squeezed, tmp_path).lin.weight.detach()[0]
    assert torch.allclose(learned, rt.TRUE_W, atol=1e-2), learned
    assert s["eval_loss"] < 1e-3


def test_an_output_wider_than_the_targets_is_refused(tmp_path):
    """F07: a [B, 3] output for [B] float targets: refused, not broadcast."""
    x, y = _regression()
    _refused_untrained(tmp_path, lambda: nn.Linear(4, 3), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]))


@pytest.mark.parametrize(
    "width, labels",
    [(1, lambda x: (x[:, 0].abs() * 3).round().long().clamp(0, 9)), (2, lambda x: (x[:, 0] > 0).float())],
    ids=["integer-targets-on-one-output", "float-class-labels-on-two-outputs"],
)
def test_labels_that_do_not_fit_the_output_are_refused_before_training(tmp_path, width, labels):
    """F12: integer targets 0..9 on a one-output model; float 0./1. labels on a two-output model."""
    x = rt.features(48)
    y = labels(x)
    _refused_untrained(tmp_path, lambda: nn.Linear(4, width), TensorDataset(x[:32], y[:32]),
                       TensorDataset(x[32:], y[32:]))  # fmt: skip


def test_a_predict_fn_keeping_a_dim_scores_as_the_labels(tmp_path):
    """F16: predictions [B, 1] for labels [B] are scored as [B]."""
    x, y = _binary()
    s = _train(lambda: nn.Linear(4, 2), TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:]), tmp_path,
               metrics=["accuracy"], predict_fn=lambda o, b: o.argmax(-1, keepdim=True), max_steps=40,
               eval_every=20)  # fmt: skip
    with torch.no_grad():
        p = _fresh(lambda: nn.Linear(4, 2), tmp_path)(x[64:]).argmax(-1)
    assert s["eval_accuracy"] == pytest.approx((p == y[64:]).double().mean().item(), abs=1e-12)


def test_a_predict_fn_of_the_wrong_length_is_refused_at_build(tmp_path):
    """F16: one prediction per batch (not per sample): refused before training."""
    x, y = _binary()
    _refused_untrained(tmp_path, lambda: nn.Linear(4, 2), TensorDataset(x[:64], y[:64]),
                       TensorDataset(x[64:], y[64:]), metrics=["accuracy"],
                       predict_fn=lambda o, b: o.argmax(-1)[:1])  # fmt: skip


class _OwnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x, labels):
        z = self.lin(x)
        return {"loss": F.cross_entropy(z, labels), "pred": z}


def test_a_model_without_logits_and_no_predict_fn_is_refused_before_training(tmp_path):
    """F20: {"loss", "pred"} and no predict_fn: refused when the run is built, not at the first evaluation."""
    x, y = _binary()
    rows = [{"x": x[i], "labels": y[i]} for i in range(96)]
    _refused_untrained(tmp_path, _OwnLoss(), rows[:64], rows[64:], max_steps=40, eval_every=20)


# --------------------------------------------------------------------------- F10 a Hugging Face tuple model


def test_a_hugging_face_model_with_return_dict_false_trains_on_its_own_loss(tmp_path):
    """F10: (loss, logits): the model's loss trains it, its logits are scored."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForSequenceClassification

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 30, (48, 6), generator=g)
    y = (ids[:, 0] > 15).long()
    rows = [{"input_ids": ids[i], "labels": y[i]} for i in range(48)]
    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, num_labels=2, return_dict=False)  # fmt: skip
    s = _train(lambda: BertForSequenceClassification(config), rows[:32], rows[32:], tmp_path, metrics=["accuracy"])
    model = _fresh(lambda: BertForSequenceClassification(config), tmp_path)
    with torch.no_grad():
        loss, logits = model(input_ids=ids[32:], labels=y[32:])[:2]
    assert s["global_step"] == 6
    assert s["eval_accuracy"] == pytest.approx((logits.argmax(-1) == y[32:]).double().mean().item(), abs=1e-12)
    assert s["eval_loss"] == pytest.approx(loss.item(), rel=1e-5)


# --------------------------------------------------------------------------- F21 F1 over the model's classes


def test_f1_averages_over_every_class_at_every_evaluation(tmp_path):
    """F21: three classes, none of class 2 in the eval set: eval_f1 is the macro F1 over classes 0, 1, 2 at every
    evaluation (scored from that step's checkpoint), whether or not the model predicts class 2."""
    from sklearn.metrics import f1_score

    x = rt.features(240)
    y = (x @ torch.randn(4, 3, generator=torch.Generator().manual_seed(1))).argmax(-1)
    test = (y != 2).nonzero().squeeze(-1)[-40:]
    train = torch.arange(240)[~torch.isin(torch.arange(240), test)]
    _train(lambda: nn.Linear(4, 3), TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test]), tmp_path,
           metrics=["f1"], max_steps=12, eval_every=3, checkpoint_every=3, keep_last=10, lr=0.5)  # fmt: skip
    evals, no_class_2 = _records(tmp_path, "eval"), 0
    assert [r["step"] for r in evals] == [3, 6, 9, 12]
    for record in evals:
        model = _fresh(lambda: nn.Linear(4, 3), tmp_path, f"checkpoints/step_{record['step']:08d}")
        with torch.no_grad():
            p = model(x[test]).argmax(-1).numpy()
        no_class_2 += int((p != 2).all())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # class 2: no sample, no prediction (scored 0)
            want = f1_score(y[test].numpy(), p, average="macro", labels=[0, 1, 2])
        assert record["eval_f1"] == pytest.approx(float(want), abs=1e-12), record["step"]
    assert no_class_2  # at least one evaluation where a binary F1 would have been taken


# --------------------------------------------------------------------------- F17 a series is not an image


def test_a_series_of_features_goes_to_the_model_as_it_is(tmp_path):
    """[12, 3] float inputs (a short series) were resized and normalised as 64 x 64 images: they reach the model
    as the dataset holds them, and the run trains on them."""
    torch.manual_seed(0)
    x = torch.rand(48, 12, 3) * 5
    y = (x[:, :, 0].mean(1) > 2.5).long()
    seen = []

    class Series(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(36, 2)

        def forward(self, inputs):
            seen.append(inputs.detach().clone())
            return self.head(inputs.flatten(1))

    _train(Series(), TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:]), tmp_path / "run")
    assert seen and all(s.shape[1:] == (12, 3) for s in seen)
    assert any(torch.equal(s[0], row) for s in seen for row in x)  # the values themselves, not a resized image


# --------------------------------------------------------------------------- F19 a re-saved datasets.Dataset


def test_a_re_saved_dataset_is_refused_naming_its_arrow_files(tmp_path):
    """A job that writes its rows with save_to_disk on every (re)start: the same rows in new Arrow files. The resume
    is refused (the files are the identity: they changed) and says so, not "other values"."""
    import datasets

    x = rt.features(48)
    y = (x[:, 0] > 0).long()

    def saved():
        path = tmp_path / "data"
        splits = {"train": slice(0, 32), "test": slice(32, 48)}
        parts = {
            k: datasets.Dataset.from_dict({"x": x[v].tolist(), "labels": y[v].tolist()}) for k, v in splits.items()
        }
        datasets.DatasetDict(parts).save_to_disk(str(path))
        loaded = datasets.load_from_disk(str(path))
        loaded.set_format("torch")
        return loaded

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x, labels=None):
            return self.linear(x)

    data = saved()
    _train(M, data["train"], data["test"], tmp_path / "run", max_steps=8, stop_at_step=4)
    data = saved()  # the requeued job preprocesses again
    with pytest.raises(UserError) as info:
        _train(M, data["train"], data["test"], tmp_path / "run", max_steps=8, resume="auto")
    assert "arrow files" in str(info.value).lower() and "other values" not in str(info.value)
