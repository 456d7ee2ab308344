"""Issue 28, item 4: one tracker run per training run (accelerate #2653: a resumed run opened a new one).

Each checkpoint saves the id of every tracker's run (``state.extra["tracker_runs"]``, ``tracking.RUN_IDS``), and a
resumed run logs into those runs: a run stopped and resumed is one MLflow run with one series of steps, and
TensorBoard and the CSV file continue too. The in-process checks of the ids (fake libraries for the trackers that
are not installed here: W&B, Aim, Comet, ClearML, SwanLab, Trackio, DVCLive) come first, then the runs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import fit_small, metrics

from accel_train.checkpoint.state import read_progress
from accel_train.run_dir import RunDir
from accel_train.tracking import RUN_IDS, TRACKER_RUNS, RunFolderMLflowTracker, tracker_run_ids, trackers_for

mlflow = pytest.importorskip("mlflow", reason="pip install mlflow-skinny (requirements-dev.txt)")

# ---- the ids, in process ------------------------------------------------------------------------------------------


class _Library:
    """A tracker library's stand-in: its ``init`` (``Run``, ``start``, ``Task.init``, ``Live``) records the keyword
    arguments and returns a run that names itself by the id it was given, or by a new one."""

    def __init__(self):
        self.calls: list[dict] = []

    def open(self, *args, **kwargs):
        self.calls.append(kwargs)
        given = ("id", "run_hash", "experiment_key", "continue_last_task", "name")
        key = next((kwargs[k] for k in given if kwargs.get(k)), f"new-{len(self.calls)}")
        return SimpleNamespace(id=key, name=key, hash=key, get_key=lambda: key, dir=kwargs.get("dir"))

    def module(self, name: str) -> SimpleNamespace:
        task = SimpleNamespace(current_task=lambda: None, init=self.open)
        return {
            "wandb": SimpleNamespace(init=self.open),
            "trackio": SimpleNamespace(init=self.open),
            "swanlab": SimpleNamespace(init=self.open, config={}),
            "aim": SimpleNamespace(Run=self.open),
            "comet_ml": SimpleNamespace(__version__="3.49.0", start=self.open),
            "clearml": SimpleNamespace(Task=task),
            "dvclive": SimpleNamespace(Live=self.open),
        }[name]


def _accelerator(*trackers, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(is_main_process=main, trackers=list(trackers))


def _checkpoint_progress(ids: dict[str, str], step: int = 4) -> dict:
    """What a checkpoint's progress.json holds of them, through JSON as the file does."""
    return json.loads(json.dumps({"state": {"global_step": step, "extra": {TRACKER_RUNS: ids}}}))


@pytest.mark.parametrize("name", sorted(set(RUN_IDS) - {"mlflow"}))
def test_a_resumed_tracker_reopens_the_run_its_checkpoint_names(name, tmp_path, monkeypatch):
    """The id round trip through accelerate's own tracker class: started, read for the checkpoint, handed back to
    the library's init on resume (W&B: ``id`` with ``resume="allow"``; Aim: ``run_hash``; Comet: ``experiment_key``;
    ClearML: ``continue_last_task``; SwanLab: ``id``; Trackio: ``name``; DVCLive: ``resume`` in its folder)."""
    import accelerate.tracking

    library = _Library()
    monkeypatch.setitem(sys.modules, name, library.module(name))
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: list(RUN_IDS))  # "installed"
    run = RunDir(tmp_path / "run")

    [first] = trackers_for(name, run)
    first.start()
    ids = tracker_run_ids(_accelerator(first))
    assert ids == {name: str(tmp_path / "run" / "dvclive") if name == "dvclive" else "new-1"}
    assert not library.calls[0].keys() & RUN_IDS[name][1]("any").keys()  # a new run: no id asked for

    [again] = trackers_for(name, run, _checkpoint_progress(ids))
    again.start()
    assert library.calls[1].items() >= RUN_IDS[name][1](ids[name]).items()
    assert tracker_run_ids(_accelerator(again)) == ids  # the same run: the next checkpoint names it again
    if name == "wandb":
        assert library.calls[1] == {"project": "accel_train", "id": "new-1", "resume": "allow"}


def test_run_ids_keep_what_this_attempt_does_not_report_and_drop_what_is_not_an_id(tmp_path, monkeypatch):
    """A resume that leaves MLflow out (``--report-to csv``) keeps its run for a later resume that reports to it;
    other ranks save none (only the main process starts trackers); a hand-edited id that is not a string is a new
    run, not an error."""
    import accelerate.tracking

    [csv_tracker] = trackers_for("csv", RunDir(tmp_path / "run"))
    assert tracker_run_ids(_accelerator(csv_tracker), {"mlflow": "abc"}) == {"mlflow": "abc"}
    assert tracker_run_ids(_accelerator(main=False), {"mlflow": "abc"}) == {"mlflow": "abc"}

    class Unnamed(accelerate.tracking.GeneralTracker):  # started without a run, or a library that renamed it
        name, requires_logging_directory, tracker = "wandb", False, None

    assert tracker_run_ids(_accelerator(Unnamed())) == {}
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: list(RUN_IDS))
    [wandb] = trackers_for("wandb", RunDir(tmp_path / "run"), _checkpoint_progress({"wandb": 7, "aim": "x"}))
    assert wandb.init_kwargs == {}


def test_an_mlflow_run_missing_from_the_store_is_a_new_run_with_a_note(tmp_path, monkeypatch, capsys):
    """A checkpoint copied to another store (MLFLOW_TRACKING_URI), or a run deleted: the attempt still runs."""
    for var in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(var)
    store = tmp_path / "run" / "mlruns"
    tracker = RunFolderMLflowTracker(tmp_path / "run", store, run_id="0" * 32)
    tracker.start()
    try:
        run_id = tracker.tracker.info.run_id
    finally:
        tracker.finish()
    assert run_id != "0" * 32
    assert f"MLflow run {'0' * 32} of the checkpoint is not in" in capsys.readouterr().err
    [run] = _mlflow_runs(tmp_path / "run")
    assert run.info.run_id == run_id


# ---- whole runs ---------------------------------------------------------------------------------------------------

# 256 samples / 16 = 16 steps per epoch: 8 steps, a checkpoint every 4, logged every step
RUN = ["--max-steps", "8", "--checkpoint-every", "4", "--report-to", "mlflow,tensorboard,csv"]


def _clean_mlflow_env(mp: pytest.MonkeyPatch) -> None:
    for var in [k for k in os.environ if k.startswith("MLFLOW_")]:  # they would redirect the run
        mp.delenv(var)


def _mlflow_runs(run_dir: Path) -> list:
    client = mlflow.tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").absolute().as_uri())
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _mlflow_history(run_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) in the order they were logged."""
    client = mlflow.tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").absolute().as_uri())
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


def _tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()  # every events file in tb/, as TensorBoard reads the folder: one per attempt
    return [e.step for e in events.Scalars(tag)]


def _csv_steps(run_dir: Path, column: str) -> list[int]:
    import csv

    with open(run_dir / "metrics.csv", newline="") as fh:
        return [int(row["step"]) for row in csv.DictReader(fh) if row[column]]


def _train_losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir) if m["event"] == "train"}


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory) -> Path:
    """One run stopped at step 4 (``--stop-at-step``) and resumed to step 8 (``--resume auto``)."""
    out = tmp_path_factory.mktemp("trackers") / "run"
    with pytest.MonkeyPatch.context() as mp:
        _clean_mlflow_env(mp)
        fit_small(out, *RUN, "--stop-at-step", "4")
        fit_small(out, *RUN, "--resume", "auto")
    return out


def test_a_stopped_and_resumed_run_is_one_mlflow_run(stopped_and_resumed):
    out = stopped_and_resumed
    [run] = _mlflow_runs(out)  # before: two runs, steps 1-4 and 5-8
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    logged = _mlflow_history(out, run.info.run_id, "train/loss")
    assert [s for s, _ in logged] == list(range(1, 9))  # strictly increasing, none twice
    assert [v for _, v in logged] == pytest.approx(list(_train_losses(out).values()))
    # one value per parameter in MLflow; the config goes to no tracker (config.yaml holds it, build.py says why),
    # so a resume that changes an allowed flag (--log-every) cannot meet MLflow's "changing a param" refusal
    assert run.data.params == {}
    for step in (4, 8):  # every checkpoint names the run
        progress = read_progress(out / "checkpoints" / f"step_{step:08d}")
        assert progress["state"]["extra"][TRACKER_RUNS] == {"mlflow": run.info.run_id}


def test_a_stopped_and_resumed_run_continues_tensorboard_and_csv(stopped_and_resumed):
    out = stopped_and_resumed
    assert len(list((out / "tb").glob("events.out.tfevents.*"))) == 2  # one per attempt, in one folder: one run
    assert _tensorboard_steps(out, "train/loss") == list(range(1, 9))
    assert _csv_steps(out, "train/loss") == list(range(1, 9))  # the resumed attempt appends, keeping steps 1-4


def test_an_attempt_with_other_trackers_keeps_the_mlflow_run_for_the_next(tmp_path, monkeypatch):
    """MLflow for steps 1-2, a resumed attempt that reports to CSV only for steps 3-4, then MLflow again for 5-6: the
    middle attempt's checkpoint still names the MLflow run, so the last attempt logs into it (one run, no new one)."""
    _clean_mlflow_env(monkeypatch)
    out = tmp_path / "run"
    every = ["--max-steps", "6", "--checkpoint-every", "2"]
    fit_small(out, *every, "--report-to", "mlflow,csv", "--stop-at-step", "2")
    [first] = _mlflow_runs(out)
    fit_small(out, *every, "--report-to", "csv", "--resume", "auto", "--stop-at-step", "4")
    assert read_progress(out / "checkpoints" / "step_00000004")["state"]["extra"][TRACKER_RUNS] == {
        "mlflow": first.info.run_id
    }
    fit_small(out, *every, "--report-to", "mlflow,csv", "--resume", "auto")
    runs = _mlflow_runs(out)
    assert [r.info.run_id for r in runs] == [first.info.run_id], f"{len(runs)} MLflow runs"
    assert [s for s, _ in _mlflow_history(out, first.info.run_id, "train/loss")] == [1, 2, 5, 6]
    assert _csv_steps(out, "train/loss") == list(range(1, 7))


def test_steps_logged_after_the_checkpoint_by_a_killed_attempt(tmp_path, monkeypatch):
    """Killed after step 6 with the last checkpoint at 4: the resumed attempt logs steps 5 and 6 again. TensorBoard
    hides the first attempt's (``purge_step``) and the CSV file drops them; MLflow cannot delete a point, so it keeps
    both, equal values at equal steps (the resume is exact), the earlier ones first (docs/run-folder.md)."""
    _clean_mlflow_env(monkeypatch)
    out = tmp_path / "run"
    fit_small(out, *RUN, "--stop-at-step", "6")
    shutil.rmtree(out / "checkpoints" / "step_00000006")  # what a kill after step 6 leaves: the checkpoint at 4
    fit_small(out, *RUN, "--resume", "auto")
    [run] = _mlflow_runs(out)
    logged = _mlflow_history(out, run.info.run_id, "train/loss")
    assert [s for s, _ in logged] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    first, again = dict(logged[:6]), dict(logged[6:])
    assert [again[5], again[6]] == pytest.approx([first[5], first[6]])
    assert _tensorboard_steps(out, "train/loss") == list(range(1, 9))
    assert _csv_steps(out, "train/loss") == list(range(1, 9))


def test_a_damaged_metrics_csv_is_set_aside_on_resume(tmp_path, capsys):
    """metrics.csv is a view of metrics.jsonl: a damaged one (not UTF-8, a broken quote) is moved aside with a
    warning line and the resume goes on (it was a UnicodeDecodeError traceback)."""
    out = tmp_path / "run"
    fit_small(out, "--report-to", "csv", "--max-steps", "6", "--stop-at-step", "3")
    (out / "metrics.csv").write_bytes(b'\x00\xff garbage,"unclosed\n1,2,3\n')
    capsys.readouterr()
    fit_small(out, "--report-to", "csv", "--max-steps", "6", "--resume", "auto")
    assert "metrics.csv is damaged (UnicodeDecodeError); moved to metrics.csv.damaged" in capsys.readouterr().err
    assert (out / "metrics.csv.damaged").read_bytes().startswith(b"\x00\xff")
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,") and [r.split(",")[0] for r in rows[1:]][:1] == ["4"]
    assert [r["step"] for r in metrics(out) if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_after_branch_the_trackers_hold_what_metrics_jsonl_holds(tmp_path):
    """--branch from step 4 of a run that went to 8: metrics.jsonl keeps steps 1-4 and continues; metrics.csv and
    TensorBoard must say the same timeline (both went whole to abandoned/, the kept steps with them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    trackers = ["--report-to", "csv,tensorboard", "--keep-last", "5", "--checkpoint-every", "4"]
    fit_small(out, *trackers, "--max-steps", "8")
    fit_small(out, *trackers, "--max-steps", "8", "--resume", str(out / "checkpoints" / "step_00000004"),
              "--branch", "--stop-at-step", "6")  # fmt: skip
    jsonl = [r["step"] for r in metrics(out) if r["event"] == "train"]
    assert jsonl == [1, 2, 3, 4, 5, 6]
    csv_steps = [int(line.split(",")[0]) for line in (out / "metrics.csv").read_text().splitlines()[1:]]
    assert sorted(set(csv_steps)) == jsonl
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == jsonl
    abandoned = next((out / "abandoned").iterdir())
    assert (abandoned / "metrics.csv").is_file() and (abandoned / "tb").is_dir()  # the old timeline, whole
