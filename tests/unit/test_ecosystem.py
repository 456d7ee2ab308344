"""Issue 13: what the libraries already do, used; and where they fall short, shown.

Trackers (any of accelerate's, checked before the run), the metric (no files, no locks, built at first
use), the state-dict helpers (torch/accelerate where they do the job) and the stratified split (datasets).


The in-process tests; whole runs and launches are in ../integration/test_ecosystem_runs.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_train.config import parse_config
from accel_train.errors import UserError
from accel_train.tracking import tracker_names


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("none", []),
        ("all", ["tensorboard", "csv"]),
        ("csv", ["csv"]),
        (" csv , mlflow ", ["csv", "mlflow"]),
        ("all,mlflow,csv", ["tensorboard", "csv", "mlflow"]),
        ("wandb,comet_ml", ["wandb", "comet_ml"]),
    ],
)
def test_report_to_takes_comma_separated_accelerate_trackers(value, names):
    assert tracker_names(value) == names


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("tensorbord", "unknown tracker 'tensorbord'"),
        ("csv,", "unknown tracker ''"),
        ("none,csv", "'none' cannot be combined"),
    ],
)
def test_unknown_trackers_are_one_line_naming_every_choice(value, needle):
    with pytest.raises(UserError) as err:
        parse_config(["--report-to", value])
    message = str(err.value)
    assert "\n" not in message and needle in message
    assert all(name in message for name in ("none", "all", "csv", "tensorboard", "mlflow", "wandb", "dvclive"))


def test_trackers_keep_their_files_in_the_run_folder_and_registered_ones_work(tmp_path, monkeypatch):
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

    from accel_train.run_dir import RunDir
    from accel_train.tracking import CSVTracker, RunFolderMLflowTracker, trackers_for

    class Mine(GeneralTracker):  # a tracker of the user's, registered with accelerate
        name = "mine"
        requires_logging_directory = True
        tracker = None

        def __init__(self, project: str, logging_dir: str):
            super().__init__()
            self.project, self.logging_dir = project, logging_dir

    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "mine", Mine)  # what register_tracker_class does
    tensorboard, csv_tracker, mlflow, mine = trackers_for("all,mlflow,mine", RunDir(tmp_path / "run"))
    assert tensorboard == "tensorboard"  # by name: accelerate writes it to <run>/tb
    assert isinstance(csv_tracker, CSVTracker) and csv_tracker.path == tmp_path / "run" / "metrics.csv"
    assert isinstance(mlflow, RunFolderMLflowTracker) and mlflow.store == tmp_path / "run" / "mlruns"
    assert isinstance(mine, Mine) and (mine.project, mine.logging_dir) == (
        "accel_train",
        str(tmp_path / "run" / "mine"),
    )
    assert parse_config(["--report-to", "mine"]).report_to == "mine"


def test_torch_prefix_helper_loses_a_tensor_where_ours_keeps_both():
    """Why ``keys._strip_uniform`` is our own: torch renames in place, key by key."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    from accel_train.checkpoint.keys import unwrap_state_dict

    outer, inner = torch.zeros(1), torch.ones(1)  # a model with a parameter `a` and a child `module` with one
    ddp = {"module.module.a": inner, "module.a": outer}
    torch_sd = dict(ddp)
    consume_prefix_in_state_dict_if_present(torch_sd, "module.")
    assert set(torch_sd) == {"a"} and torch_sd["a"] is inner  # `module.a` was overwritten, `outer` is gone
    ours, prefixes = unwrap_state_dict(ddp)
    assert ours["module.a"] is inner and ours["a"] is outer and len(ours) == 2 and prefixes == ["module."]

    mixed = {"module.a": outer, "b": inner}  # some keys only: torch strips them, we leave and report them
    torch_sd = dict(mixed)
    consume_prefix_in_state_dict_if_present(torch_sd, "module.")
    assert set(torch_sd) == {"a", "b"}
    ours, prefixes = unwrap_state_dict(mixed)
    assert set(ours) == {"module.a", "b"} and prefixes == []


def test_unwrap_model_uses_accelerate_and_repeats_for_compile_inside_a_wrapper():
    from accelerate.utils import extract_model_from_parallel

    from accel_train.checkpoint.keys import unwrap_model

    plain = nn.Linear(2, 2)
    wrapped = nn.DataParallel(torch.compile(plain))  # compiled, then wrapped: the compile is inside
    once = extract_model_from_parallel(wrapped, keep_torch_compile=False)
    assert once is not plain and once._orig_mod is plain  # one call leaves the inner compile on
    assert unwrap_model(wrapped) is plain
    assert unwrap_model(torch.compile(nn.DataParallel(plain))) is plain
    assert unwrap_model(plain) is plain


def test_stratified_split_is_datasets_split_deterministic_from_the_seed():
    from accel_train.data.base import stratified_split

    labels = torch.tensor([7] * 10 + [3] * 20 + [5] * 30)  # any label values, unbalanced
    train, test = stratified_split(labels, 0.2, seed=1)
    assert len(test) == 12 and len(train) == 48 and sorted(torch.cat([train, test]).tolist()) == list(range(60))
    assert [int((labels[test] == c).sum()) for c in (7, 3, 5)] == [2, 4, 6]  # stratified
    assert torch.equal(stratified_split(labels, 0.2, seed=1)[1], test)
    assert not torch.equal(stratified_split(labels, 0.2, seed=2)[1], test)
    assert all(len(part) == 0 for part in stratified_split(torch.tensor([0, 1, 2, 0]), 0.25, seed=0))
