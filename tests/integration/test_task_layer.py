"""The generic task layer (accel_train/tasks), in process: which data is which task, labels and outputs of any
batch, the loss and the predictions, randomness keyed on the micro-batch, exact evaluation over rank blocks, the
metrics and the monitor, the data's identity, the options refused and the resumes refused, early stopping on a
monitor where lower is better, and ``accel_train.train``'s refusals before any run. No run, no launch."""

from __future__ import annotations

import math
import types
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from checks import raises_user_error
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from accel_train.data.base import DatasetInfo, DataSplits
from accel_train.data.identity import changes
from accel_train.evaluation import best_note
from accel_train.features.early_stop import EarlyStopping
from accel_train.tasks import GenericTask, ImageTask, check_resumed_task, refuse_image_options
from accel_train.tasks.data import generic_splits, wants_generic
from accel_train.tasks.generic import call, keyed_rng, labels_of, output_tensor
from accel_train.tasks.scores import Scores

NO_OPTIONS = dict.fromkeys(("collate_fn", "loss_fn", "metrics", "predict_fn", "monitor", "monitor_mode"))


def _task(classification=True, metrics=None, **kw) -> GenericTask:
    return GenericTask(classification, Scores(metrics), **kw)


def _splits(train, test) -> DataSplits:
    return DataSplits(train, test, DatasetInfo("custom", 0, 0, 0, [], (), ()), in_memory=False)


def _fake_acc(rank: int = 0, world: int = 1):
    return types.SimpleNamespace(
        process_index=rank, num_processes=world, device=torch.device("cpu"), unwrap_model=lambda m: m,
        autocast=nullcontext,
    )  # fmt: skip


# ---- which task ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sample, generic",
    [
        ({"input_ids": torch.arange(5), "label": 1}, True),  # text: no image key
        ({"image": torch.zeros(1, 8, 8, dtype=torch.uint8), "label": 1}, False),
        ({"image": torch.zeros(1, 8, 8, dtype=torch.uint8), "label": 0.5}, True),  # an image regression
        ((torch.randn(8), 1), True),  # a vector of features
        ((torch.zeros(1, 8, 8), 1), False),
        ((torch.zeros(1, 8, 8), 0.5), True),
        ((torch.zeros(1, 8, 8), torch.tensor(0.5)), True),
    ],
)
def test_which_samples_train_the_generic_task(sample, generic):
    assert wants_generic(sample, NO_OPTIONS) is generic


@pytest.mark.parametrize("option", sorted(NO_OPTIONS))
def test_any_task_option_means_the_generic_task(option):
    image = (torch.zeros(1, 8, 8), 1)
    assert wants_generic(image, {**NO_OPTIONS, option: "eval_f1" if "monitor" in option else len})


# ---- labels, the call, the outputs -----------------------------------------------------------------------------------
def test_labels_of_a_dict_and_of_a_tuple():
    a, b = torch.tensor([1, 0]), torch.tensor([2, 2])
    assert labels_of({"x": b, "labels": a}) is a
    assert labels_of({"label": a, "x": b}) is a
    assert labels_of({"target": a, "x": b}) is a
    assert labels_of({"labels": a, "label": b}) is a  # "labels" first, as Hugging Face models take it
    assert labels_of({"label": a, "target": b}) is a
    assert labels_of((b, torch.ones(2), a)) is a  # the last element
    raises_user_error(lambda: labels_of({"input_ids": a}), "no labels", "input_ids")
    raises_user_error(lambda: labels_of(a), "samples must be dicts")
    raises_user_error(lambda: labels_of({"labels": [1, 0]}), "not a tensor")


def test_call_takes_a_dict_as_keywords_and_a_tuple_without_its_target():
    seen = []

    def model(*args, **kwargs):
        seen.append((args, kwargs))
        return 0

    x, y, t = torch.ones(2), torch.zeros(2), torch.tensor([1, 0])
    call(model, {"input_ids": x, "labels": t})
    call(model, (x, y, t))
    assert seen[0] == ((), {"input_ids": x, "labels": t})
    assert len(seen[1][0]) == 2 and seen[1][0][0] is x and seen[1][0][1] is y and seen[1][1] == {}


def test_output_tensor_picks_the_logits_not_the_loss():
    from transformers.modeling_outputs import SequenceClassifierOutput

    logits, loss = torch.randn(2, 3), torch.tensor(0.7)
    assert output_tensor(SequenceClassifierOutput(loss=loss, logits=logits)) is logits
    assert output_tensor(SequenceClassifierOutput(logits=logits)) is logits
    assert output_tensor({"loss": loss, "logits": logits}) is logits
    assert output_tensor((logits, torch.ones(1))) is logits
    assert output_tensor(logits) is logits
    raises_user_error(lambda: output_tensor({"loss": loss}), "without logits", "predict_fn")


# ---- the loss --------------------------------------------------------------------------------------------------------
def test_the_loss_fn_wins_then_the_model_s_own_loss():
    from transformers.modeling_outputs import SequenceClassifierOutput

    labels = torch.tensor([0, 1])
    out = SequenceClassifierOutput(loss=torch.tensor(3.0), logits=torch.randn(2, 2))

    def loss_fn(outputs, batch):
        return torch.tensor(7.0)

    assert _task(loss_fn=loss_fn).loss(out, None, labels).item() == 7.0
    own = _task()
    assert own.loss(out, None, labels).item() == 3.0 and "outputs.loss" in own.loss_said


def test_the_default_losses_are_cross_entropy_and_mse_of_the_squeezed_values():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(5, 3, generator=g), torch.tensor([0, 2, 1, 1, 0])
    ce = _task().loss(logits, None, labels)
    assert ce.shape == () and torch.allclose(ce, F.cross_entropy(logits, labels))
    values, targets = torch.randn(5, 1, generator=g), torch.randn(5, generator=g)
    mse = _task(False).loss(values, None, targets)
    assert torch.allclose(mse, F.mse_loss(values.squeeze(-1), targets))
    assert not torch.allclose(mse, ((values - targets) ** 2).mean())  # the [B, B] broadcast it must not be


def test_a_loss_that_is_not_one_number_is_one_line():
    def loss_fn(outputs, batch):
        return torch.ones(4)

    raises_user_error(lambda: _task(loss_fn=loss_fn).loss(torch.ones(4, 2), None, torch.zeros(4)), "one number")


# ---- the predictions -------------------------------------------------------------------------------------------------
def test_predictions_are_the_argmax_the_values_or_predict_fn_s():
    logits = torch.tensor([[0.1, 0.9, 0.0], [2.0, 0.0, 1.0]])
    assert _task().predictions(logits, None, torch.tensor([1, 0])).tolist() == [1, 0]
    assert _task().predictions(torch.tensor([0.3, -0.2]), None, torch.tensor([1, 0])).tolist() == [1, 0]
    values = torch.tensor([[0.5], [-1.5]])
    got = _task(False).predictions(values, None, torch.tensor([0.0, 0.0]))
    assert got.shape == (2,) and got.tolist() == [0.5, -1.5]
    assert _task(predict_fn=lambda outputs, batch: [7, 8]).predictions(logits, None, torch.tensor([1, 0])).tolist() == [
        7,
        8,
    ]


# ---- randomness keyed on the micro-batch -----------------------------------------------------------------------------
def _draw(seed, epoch, indices):
    with keyed_rng(seed, epoch, torch.tensor(indices), torch.device("cpu")) as drew:
        x = torch.rand(4)
    return x, drew


def test_keyed_rng_draws_by_seed_epoch_and_indices_and_leaves_the_outer_state():
    torch.manual_seed(123)
    outer = torch.random.get_rng_state()
    a, drew = _draw(0, 1, [3, 5])
    assert drew == [True]
    assert torch.equal(torch.random.get_rng_state(), outer)
    assert torch.equal(a, _draw(0, 1, [3, 5])[0])
    assert not torch.equal(a, _draw(0, 1, [3, 6])[0])
    assert not torch.equal(a, _draw(0, 2, [3, 5])[0])  # another epoch
    assert not torch.equal(a, _draw(1, 1, [3, 5])[0])  # another seed
    with keyed_rng(0, 1, torch.tensor([3, 5]), torch.device("cpu")) as quiet:
        pass
    assert quiet == [False]
    assert torch.equal(torch.random.get_rng_state(), outer)


# ---- evaluation ------------------------------------------------------------------------------------------------------
def _classification_data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))


def test_evaluate_on_one_process_equals_an_independent_computation():
    from accelerate import Accelerator
    from sklearn.metrics import f1_score

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    test = _classification_data(7)
    task = _task(metrics=["f1"])
    acc = Accelerator(cpu=True)
    _, loader = task.loaders(_splits(_classification_data(8, 1), test), 2, 4, 0, 2, acc, 0, (False, False))
    out = task.evaluate(acc, model, loader)
    x, y = test.tensors
    with torch.no_grad():
        logits = model(x)
    assert out["eval_samples"] == 7
    assert math.isclose(out["eval_loss"], F.cross_entropy(logits, y).item(), rel_tol=1e-6)
    assert math.isclose(out["eval_f1"], f1_score(y.numpy(), logits.argmax(1).numpy()), rel_tol=1e-9)
    assert model.training  # put back


def test_evaluate_a_regression_weights_each_batch_by_its_size():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    g = torch.Generator().manual_seed(2)
    test = TensorDataset(torch.randn(7, 3, generator=g), torch.randn(7, generator=g))
    task = _task(False, metrics=["mse"])
    _, loader = task.loaders(_splits(test, test), 1, 4, 0, 1, _fake_acc(), 0, (False, False))  # 4 + 3
    out = task.evaluate(_fake_acc(), model, loader)
    x, y = test.tensors
    with torch.no_grad():
        expected = F.mse_loss(model(x).squeeze(-1), y).item()
    assert math.isclose(out["eval_loss"], expected, rel_tol=1e-6)
    assert math.isclose(out["eval_mse"], expected, rel_tol=1e-6)
    assert out["eval_samples"] == 7


def _blocks(n: int, world: int) -> list[list[int]]:
    task, test = _task(), TensorDataset(torch.arange(n).float()[:, None], torch.arange(n))
    got = []
    for rank in range(world):
        _, loader = task.loaders(_splits(_classification_data(8), test), 2, 3, 0, 2, _fake_acc(rank, world), 0,
                                 (False, False))  # fmt: skip
        got.append([i for _, labels in loader for i in labels.tolist()])
    return got


@pytest.mark.parametrize("n", [2, 7, 13])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_eval_blocks_of_the_ranks_hold_every_sample_once_in_order(n, world):
    if n < world:
        pytest.skip("an empty block: test_an_eval_set_smaller_than_the_ranks_leaves_a_rank_an_empty_block")
    blocks = _blocks(n, world)
    assert [i for block in blocks for i in block] == list(range(n))  # contiguous, in rank order, each once
    assert all(block == list(range(block[0], block[0] + len(block))) for block in blocks if block)
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1  # balanced


@pytest.mark.parametrize("n, world", [(0, 1), (1, 2), (1, 3), (2, 3)])
def test_an_eval_set_smaller_than_the_ranks_leaves_a_rank_an_empty_block(n, world):
    """A rank with no eval sample is given an empty loader (GenericTask.evaluate handles an empty block)."""
    blocks = _blocks(n, world)
    assert [i for block in blocks for i in block] == list(range(n))


def test_evaluate_gathers_the_ranks_blocks_in_order():
    """Two ranks simulated in one process: each rank's (predictions, labels, loss sum) gathered in rank order give
    what one process computes on the whole set, the predictions in the set's order."""
    import accelerate.utils

    torch.manual_seed(0)
    model, test = nn.Linear(3, 2), _classification_data(7)
    seen = []

    def order(predictions, references):
        seen.append((predictions.tolist(), references.tolist()))
        return 0.0

    task = GenericTask(True, Scores({"order": order}, monitor_mode="max"))  # "order": no direction in its name
    mine, world = [], 2
    real = accelerate.utils.gather_object
    try:
        for rank in range(world):  # each rank's own part
            accelerate.utils.gather_object = lambda obj: (mine.extend(obj), obj)[1]
            _, loader = task.loaders(_splits(test, test), 1, 2, 0, 1, _fake_acc(rank, world), 0, (False, False))
            task.evaluate(_fake_acc(rank, world), model, loader)
        accelerate.utils.gather_object = lambda obj: list(mine)
        _, loader = task.loaders(_splits(test, test), 1, 2, 0, 1, _fake_acc(0, world), 0, (False, False))
        gathered = task.evaluate(_fake_acc(0, world), model, loader)
    finally:
        accelerate.utils.gather_object = real
    _, loader = task.loaders(_splits(test, test), 1, 3, 0, 1, _fake_acc(), 0, (False, False))
    whole = task.evaluate(_fake_acc(), model, loader)
    assert gathered["eval_samples"] == whole["eval_samples"] == 7
    assert math.isclose(gathered["eval_loss"], whole["eval_loss"], rel_tol=1e-6)  # float32 batches of 2 and 3
    assert seen[-1] == seen[-2] and seen[-1][1] == test.tensors[1].tolist()


# ---- metrics and the monitor -----------------------------------------------------------------------------------------
def _sk():
    from sklearn import metrics

    return metrics


@pytest.mark.parametrize(
    "name, preds, refs, expected",
    [
        ("f1", [0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0], lambda m, p, r: m.f1_score(r, p)),
        ("f1", [0, 1, 2, 2, 1, 0, 2], [0, 2, 2, 1, 1, 0, 0], lambda m, p, r: m.f1_score(r, p, average="macro")),
        ("precision", [0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0], lambda m, p, r: m.precision_score(r, p)),
        ("recall", [0, 1, 0, 0, 1, 1], [0, 1, 1, 0, 1, 1], lambda m, p, r: m.recall_score(r, p)),
        (
            "recall", [0, 1, 2, 2, 1, 0, 2], [0, 2, 2, 1, 1, 0, 0],
            lambda m, p, r: m.recall_score(r, p, average="macro"),
        ),
        ("matthews_correlation", [0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0], lambda m, p, r: m.matthews_corrcoef(r, p)),
        ("mse", [0.5, 1.0, 2.5], [0.0, 1.5, 2.0], lambda m, p, r: m.mean_squared_error(r, p)),
        ("rmse", [0.5, 1.0, 3.5], [0.0, 1.5, 2.0], lambda m, p, r: m.mean_squared_error(r, p) ** 0.5),
        ("mae", [0.5, 1.0, 3.5], [0.0, 1.5, 2.0], lambda m, p, r: m.mean_absolute_error(r, p)),
        ("r_squared", [0.5, 1.0, 3.5], [0.0, 1.5, 2.0], lambda m, p, r: m.r2_score(r, p)),
    ],
)  # fmt: skip
def test_the_shipped_scores_load_offline_and_equal_sklearn(name, preds, refs, expected, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    got = Scores([name]).compute(torch.tensor(preds), torch.tensor(refs))
    assert list(got) == [f"eval_{name}"]
    assert math.isclose(got[f"eval_{name}"], float(expected(_sk(), preds, refs)), rel_tol=1e-9, abs_tol=1e-12)


def test_two_classes_score_the_positive_class_not_the_macro_average():
    preds, refs = [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]
    got = Scores(["f1"]).compute(torch.tensor(preds), torch.tensor(refs))["eval_f1"]
    assert not math.isclose(got, _sk().f1_score(refs, preds, average="macro"))


def test_callables_numbers_and_dicts_become_eval_keys():
    def half(predictions, references):
        return 0.5

    def both(predictions, references):
        return {"a": torch.tensor(1.0), "b": 2}

    scores = Scores({"half": half, "pair": both}, monitor_mode="max")  # "half": no direction in its name
    got = scores.compute(torch.tensor([1]), torch.tensor([1]))
    assert got == {"eval_half": 0.5, "eval_a": 1.0, "eval_b": 2.0}
    assert scores.keys() == ["eval_half", "eval_a", "eval_b"]
    raises_user_error(lambda: Scores([lambda p, r: 1.0]), "no name")
    named = Scores([half], monitor_mode="max")  # named by the function
    assert named.compute(torch.ones(1), torch.ones(1)) == {"eval_half": 0.5}
    bad = Scores({"bad": lambda p, r: "x"}, monitor_mode="min")
    raises_user_error(lambda: bad.compute(torch.ones(1), torch.ones(1)), "numbers")


def test_an_unknown_metric_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    raises_user_error(lambda: Scores(["no_such_metric_here"]), "no_such_metric_here", "pass a function")


def test_a_metric_named_twice_is_refused():
    raises_user_error(lambda: Scores(["mse", "mse"]), "twice")


@pytest.mark.parametrize(
    "metrics, monitor, mode, key, higher",
    [
        (None, None, None, "eval_loss", False),
        (["mse", "f1"], None, None, "eval_mse", False),
        (["f1", "mse"], None, None, "eval_f1", True),
        (["mae"], None, None, "eval_mae", False),
        (["rmse"], None, None, "eval_rmse", False),
        (["r_squared"], None, None, "eval_r_squared", True),
        (["f1", "mse"], "mse", None, "eval_mse", False),
        (["f1", "mse"], "eval_mse", None, "eval_mse", False),
        (["mse"], None, "max", "eval_mse", True),
        (["f1"], None, "min", "eval_f1", False),
        (None, None, "max", "eval_loss", True),
    ],
)
def test_the_monitor_and_its_direction(metrics, monitor, mode, key, higher):
    scores = Scores(metrics, monitor, mode)
    assert (scores.monitor, scores.higher) == (key, higher)
    task = GenericTask(True, scores)
    assert (task.monitor, task.higher) == (key, higher)
    assert task.record()["mode"] == ("max" if higher else "min")


def test_a_monitor_that_no_metric_computes_is_refused():
    raises_user_error(lambda: Scores(["mse"], monitor="eval_f1").compute(torch.ones(2), torch.ones(2)), "eval_f1")
    raises_user_error(lambda: Scores(["mse"], monitor_mode="lowest"), "monitor_mode")


# ---- the data's identity ---------------------------------------------------------------------------------------------
class _Dicts(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _rows(change: bool = False):
    rows = [{"input_ids": torch.arange(i, i + 4), "label": i % 2, "weight": 0.5 * i} for i in range(6)]
    if change:
        rows[3] = {**rows[3], "weight": 9.0}
    return rows


def _tensors(change: bool = False):
    x = torch.arange(24.0).reshape(6, 4)
    if change:
        x[2, 1] = -1.0
    return TensorDataset(x, torch.arange(6) % 2)


def _hf(change: bool = False):
    import datasets

    columns = {"input_ids": [[i, i + 1] for i in range(6)], "label": [i % 2 for i in range(6)]}
    if change:
        columns["input_ids"][4] = [0, 0]
    return datasets.Dataset.from_dict(columns)


def _identity(train, test=None):
    splits, _ = generic_splits(train, test if test is not None else train, None, None, None)
    return splits.extra["identity"]


@pytest.mark.parametrize(
    "build",
    [
        _tensors,
        lambda change=False: _Dicts(_rows(change)),
        _hf,
        lambda change=False: Subset(_tensors(change), [1, 2, 4]),
        lambda change=False: Subset(_hf(change), [0, 4, 5]),
    ],
    ids=["tensors", "dicts", "hf", "subset", "hf-subset"],
)
def test_the_identity_follows_the_data(build):
    same, again = _identity(build()), _identity(build())
    assert same.digest == again.digest  # the same data rebuilt
    changed = _identity(build(change=True))
    assert changed.digest != same.digest
    assert changes(same.record(), changed) is not None
    assert changes(same.record(), again) is None


def test_the_identity_of_a_subset_follows_its_indices():
    assert _identity(Subset(_tensors(), [1, 2])).digest != _identity(Subset(_tensors(), [1, 3])).digest
    assert _identity(Subset(_hf(), [1, 2])).digest != _identity(Subset(_hf(), [1, 3])).digest


def test_the_identity_sees_each_field_and_the_key_it_is_under():
    rows = _rows()
    renamed = [{("score" if k == "weight" else k): v for k, v in row.items()} for row in rows]
    assert _identity(_Dicts(rows)).digest != _identity(_Dicts(renamed)).digest
    other = [{**row, "input_ids": row["input_ids"].flip(0)} for row in rows]
    assert _identity(_Dicts(rows)).digest != _identity(_Dicts(other)).digest


# ---- options and resumes ---------------------------------------------------------------------------------------------
def test_image_only_options_are_refused_on_the_generic_task():
    cfg = types.SimpleNamespace(given={"mixup", "lr"})
    raises_user_error(lambda: refuse_image_options(cfg, _task()), "--mixup", "image classification only")
    refuse_image_options(cfg, ImageTask(3))  # the image task takes them
    refuse_image_options(types.SimpleNamespace(given={"lr", "epochs"}), _task())  # not image-only
    raises_user_error(lambda: refuse_image_options(types.SimpleNamespace(given={"image_size"}), _task()),
                      "--image-size")  # fmt: skip


def test_a_resume_must_score_the_run_as_its_checkpoint_did():
    task = _task(metrics=["f1"])
    check_resumed_task(task.record(), task)
    check_resumed_task(_task(metrics=["f1"]).record(), task)
    check_resumed_task(None, ImageTask(3))  # an image run's record is None
    other_monitor = GenericTask(True, Scores(["f1"], monitor="eval_loss"))
    raises_user_error(lambda: check_resumed_task(task.record(), other_monitor), "monitor", "eval_loss")
    raises_user_error(lambda: check_resumed_task(task.record(), _task(metrics=["f1", "mse"])), "metrics")
    raises_user_error(lambda: check_resumed_task(task.record(), _task(False, metrics=["f1"])), "regression")
    raises_user_error(lambda: check_resumed_task(None, task), "same task")
    raises_user_error(lambda: check_resumed_task(task.record(), ImageTask(3)), "same task")


# ---- early stopping on a monitor, best/'s note -----------------------------------------------------------------------
def test_early_stopping_where_lower_is_better():
    stop = EarlyStopping(patience=2, key="eval_loss", higher=False)
    assert stop.observe(1.0, 1) is None and stop.observe(0.8, 2) is None  # better
    assert stop.observe(0.8, 3) is None  # equal: not better
    why = stop.observe(0.9, 4)
    assert why is not None and "eval_loss" in why and "best 0.8000 at step 2" in why
    delta = EarlyStopping(patience=1, min_delta=0.1, key="eval_mse", higher=False)
    assert delta.observe(1.0, 1) is None and delta.observe(0.85, 2) is None  # more than 0.1 lower
    assert delta.observe(0.8, 3) is not None  # 0.05 lower: not by more than min_delta
    assert "eval_mse" in delta.reason() and "by more than 0.1" in delta.reason()


def test_best_note_of_images_and_of_other_data():
    best = Path("runs/x/best")
    images = best_note(3, 0.9, 5, best)["best_note"]
    assert images == (
        "best/ (step 3, eval_accuracy 0.9000) was chosen on the test split that also scores it (there is no "
        "separate validation split), so that accuracy is optimistic: score it on images kept out of training and "
        f"testing with accel-evaluate --weights {best} --dataset imagefolder:DIR"
    )
    other = best_note(3, 0.25, 5, best, key="eval_mse", images=False)["best_note"]
    assert "eval_mse 0.2500" in other and "that figure is optimistic" in other and "accel-evaluate" not in other
    assert best_note(5, 0.9, 5, best) == {} and best_note(None, None, 5, best) == {}


# ---- accel_train.train's refusals before a run -----------------------------------------------------------------------
def test_train_refuses_what_cannot_run_on_generic_data():
    import accel_train

    data = TensorDataset(torch.randn(8, 3), torch.arange(8) % 2)
    raises_user_error(lambda: accel_train.train("lenet", data), "'lenet'", "not images")
    raises_user_error(lambda: accel_train.train(None, data), "needs your model")
    raises_user_error(lambda: accel_train.train(metrics=["f1"]), "metrics", "without train_dataset")
    raises_user_error(lambda: accel_train.train(loss_fn=len, monitor="eval_f1"), "loss_fn, monitor")
