"""What the user sees and keeps of a run: metrics.jsonl, trackers, progress.

Only the main process writes or prints. ``metrics.jsonl`` is always written; the trackers
``--report-to`` names (CSV, TensorBoard, and any of accelerate's: MLflow, W&B, Aim, ...) go through
``accelerator.init_trackers``/``accelerator.log``, with their local files in the run folder. A resumed run logs
into the tracker runs its checkpoint names (:data:`RUN_IDS`): one training run, one tracker run.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker, MLflowTracker, on_main_process

from accel_train.errors import UserError
from accel_train.finite_json import finite
from accel_train.fsio import append_line, drop_partial_line
from accel_train.run_dir import METRICS_CSV, MLRUNS, TENSORBOARD, RunDir

PROJECT = "accel_train"  # the project/experiment name trackers file a run under
ALL_TRACKERS = ("tensorboard", "csv")  # --report-to all: the two that need no account and no extra package
PIP_PACKAGES = {"comet_ml": "comet-ml"}  # where the pip package is not named like the tracker
TRACKER_RUNS = "tracker_runs"  # the key in a checkpoint's ``state.extra``: tracker name -> that tracker's run id

#: How a tracker names its run and how it opens that run again: tracker name -> (the id, read from the tracker's
#: own object, accelerate's ``GeneralTracker.tracker``; the keyword arguments that reopen the run, which accelerate's
#: tracker class hands to the library's ``init``). Each checkpoint saves the ids (``TRACKER_RUNS``), and a resumed
#: run logs into those runs instead of opening new ones. TensorBoard and CSV need none: they continue their files
#: in the run folder. A tracker of your own (``register_tracker_class``) resumes its run once it has an entry here.
RUN_IDS: dict[str, tuple[Callable[[Any], Any], Callable[[str], dict[str, Any]]]] = {
    "mlflow": (lambda run: run.info.run_id, lambda run_id: {"run_id": run_id}),
    "wandb": (lambda run: run.id, lambda run_id: {"id": run_id, "resume": "allow"}),  # allow: else a new run, same id
    "aim": (lambda run: run.hash, lambda run_id: {"run_hash": run_id}),
    "comet_ml": (lambda experiment: experiment.get_key(), lambda key: {"experiment_key": key}),  # comet_ml >= 3.41
    "clearml": (lambda task: task.id, lambda task_id: {"continue_last_task": task_id}),
    "swanlab": (lambda run: run.id, lambda run_id: {"id": run_id, "resume": "allow"}),
    "trackio": (lambda run: run.name, lambda name: {"name": name, "resume": "allow"}),  # trackio resumes by name
    "dvclive": (lambda live: live.dir, lambda _: {"resume": True}),  # its run is its folder: keep its files
}


class CSVTracker(GeneralTracker):
    """A minimal accelerate tracker writing ``metrics.csv`` (one row per log call)."""

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, resumed_step: int | None = None):
        super().__init__()
        self.run_name = run_name
        self.path = Path(logging_dir) / METRICS_CSV
        self.resumed_step = resumed_step  # a resumed run continues the file from the checkpoint's step
        self._fields: list[str] = []
        self._rows: list[dict[str, Any]] = []  # every row: a new column rewrites the file with all of them

    @property
    def tracker(self):
        return self.path

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        pass  # config.yaml already holds it

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        row = {"step": step, **{k: v for k, v in values.items() if isinstance(v, (int, float))}}
        if not self._fields and self.resumed_step is not None and self.path.is_file():
            try:
                self._fields, self._rows = _rows_until(self.path, self.resumed_step)
            except (UnicodeDecodeError, csv.Error, ValueError) as exc:  # metrics.jsonl is the record; this a view
                aside = self.path.with_name(self.path.name + ".damaged")
                os.replace(self.path, aside)
                what = f"{self.path} is damaged ({type(exc).__name__}); moved to {aside.name}, a new one starts"
                print(f"accel_train: warning: {what} at step {step} (metrics.jsonl has all records)", file=sys.stderr)
        self._rows.append(row)
        new = [k for k in row if k not in self._fields]
        if new:  # a new column: rewrite the file with the widened header
            self._fields += new
            with open(self.path, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=self._fields)
                writer.writeheader()
                writer.writerows(self._rows)
        else:
            with open(self.path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self._fields).writerow(row)


class RunFolderMLflowTracker(MLflowTracker):
    """accelerate's MLflow tracker, keeping the run in ``<run folder>/mlruns`` unless ``MLFLOW_TRACKING_URI``
    names a server or a database: no server to start, and ``mlflow-skinny`` is enough.
    ``mlflow ui --backend-store-uri <run folder>/mlruns`` shows it."""

    def __init__(self, run_dir: str | os.PathLike, store: str | os.PathLike, run_id: str | None = None):
        super().__init__(experiment_name=PROJECT, run_name=Path(run_dir).name, run_id=run_id)
        self.store = Path(store).absolute()
        self.saved_run_id = run_id  # the run a resumed run's checkpoint names (MLFLOW_RUN_ID, if set, wins)

    @on_main_process
    def start(self) -> None:
        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens file stores only when asked
            mlflow.set_tracking_uri(self.store.as_uri())
        if self.run_id and self.run_id == self.saved_run_id and not _mlflow_run_exists(self.run_id):
            print(
                f"accel_train: MLflow run {self.run_id} of the checkpoint is not in {mlflow.get_tracking_uri()} "
                "(deleted, or another MLFLOW_TRACKING_URI); this attempt logs to a new run",
                file=sys.stderr,
                flush=True,
            )
            self.run_id = None
        super().start()


def _mlflow_run_exists(run_id: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient().get_run(run_id).info.lifecycle_stage != "deleted"  # MLflow refuses to reopen those
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return False


def _rows_until(path: Path, step: int) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of an earlier attempt's ``metrics.csv`` up to ``step``, the checkpoint a resumed run
    starts from (what that attempt logged after it, the resumed run logs again)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if not r.get("step", "").isdigit() or int(r["step"]) <= step]
        return list(reader.fieldnames or []), rows


def tracker_run_ids(accelerator, kept: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Tracker name -> the id of the run each of ``accelerator``'s started trackers logs into (:data:`RUN_IDS`),
    for the checkpoint; ``kept``: the ids a resumed checkpoint saved, kept for trackers this attempt leaves out."""
    ids = _string_pairs(kept)
    for tracker in accelerator.trackers if accelerator.is_main_process else ():  # only the main process starts them
        read = RUN_IDS.get(tracker.name, (None,))[0]
        try:
            run_id = read(tracker.tracker) if read is not None else None
        except AttributeError:  # not started, or a library version that names it otherwise: a new run on resume
            run_id = None
        if run_id is not None:
            ids[tracker.name] = str(run_id)
    return ids


def saved_run_ids(progress: Mapping[str, Any]) -> dict[str, str]:
    """The tracker run ids a checkpoint's ``progress.json`` saved (:func:`tracker_run_ids`); {} for none."""
    return _string_pairs(progress.get("state", {}).get("extra", {}).get(TRACKER_RUNS))


def _string_pairs(ids: Any) -> dict[str, str]:
    """``ids`` as a name -> id dict; anything else in it (a hand-edited progress.json) is left out: a new run."""
    if not isinstance(ids, Mapping):
        return {}
    return {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, str)}


def accelerate_trackers() -> list[str]:
    """The tracker names accelerate knows: its own (``LoggerType``) and any added by ``register_tracker_class``."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return sorted(LOGGER_TYPE_TO_CLASS)


def tracker_names(report_to: str) -> list[str]:
    """``--report-to`` as tracker names: comma-separated, ``all`` = tensorboard + csv, ``none`` alone = []."""
    names: list[str] = []
    for name in (part.strip() for part in report_to.split(",")):
        if name == "none" and report_to.strip() == "none":
            return []
        if name == "all":
            names += [n for n in ALL_TRACKERS if n not in names]
        elif name in ALL_TRACKERS or name in accelerate_trackers():
            names += [name] if name not in names else []
        else:
            known = ", ".join(["none", "all", "csv", *accelerate_trackers()])
            why = "'none' cannot be combined with other trackers" if name == "none" else f"unknown tracker {name!r}"
            raise UserError(f"--report-to {report_to!r}: {why}; use one or more of {known}, comma-separated")
    return names


def check_installed(names: list[str]) -> None:
    """A one-line UserError naming the pip package of the first chosen tracker that is not installed.

    accelerate itself drops such a tracker with a debug message only, and the run would log nowhere."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    available = {str(t) for t in get_available_trackers()}
    for name in names:
        if name in LoggerType.list() and name not in available:
            package = PIP_PACKAGES.get(name, name)
            raise UserError(f"--report-to {name} needs the {package} package: pip install {package} (or drop {name})")


def trackers_for(report_to: str, run: RunDir, resumed: Mapping[str, Any] | None = None) -> list:
    """``Accelerator(log_with=...)`` for ``--report-to``, checked (names, packages) before the run starts.

    TensorBoard goes by name (accelerate writes it to the run folder's ``tb/``); the others are built here, so
    that they file the run under :data:`PROJECT` and keep their local files in the run folder (MLflow's store
    in ``mlruns/``: the run folder names them all). ``resumed``: the ``progress.json`` of the checkpoint a resumed
    run starts from: the trackers reopen the runs it names (:data:`RUN_IDS`), and what an earlier attempt logged
    after its step is dropped where the tracker allows (TensorBoard hides it, CSV rewrites without it)."""
    names = tracker_names(report_to)
    check_installed(names)
    ids = saved_run_ids(resumed or {})
    step = resumed["state"]["global_step"] if resumed is not None else None
    return [_tracker(name, run.path, run / MLRUNS, ids.get(name), step) for name in names]


def _tracker(name: str, run_dir: Path, mlruns: Path, run_id: str | None = None, resumed_step: int | None = None):
    if name == "tensorboard" and resumed_step is not None:
        from accelerate.tracking import TensorBoardTracker

        # purge_step: TensorBoard hides what an earlier attempt logged after the checkpoint (logged again now)
        return TensorBoardTracker(TENSORBOARD, run_dir, purge_step=resumed_step + 1)
    if name == "tensorboard":
        return name
    if name == "csv":
        return CSVTracker(PROJECT, run_dir, resumed_step)
    if name == "mlflow":
        return RunFolderMLflowTracker(run_dir, mlruns, run_id)
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    cls = LOGGER_TYPE_TO_CLASS[name]
    kwargs = {"dir": str(run_dir / name)} if name == "dvclive" else {}  # else DVCLive writes ./dvclive
    if run_id is not None and name in RUN_IDS:
        kwargs.update(RUN_IDS[name][1](run_id))
    if cls.requires_logging_directory:  # Aim, and trackers registered with register_tracker_class
        return cls(PROJECT, str(run_dir / name), **kwargs)
    return cls(PROJECT, **kwargs)


def tracker_tag(event: str, name: str) -> str:
    """A metric's name in the trackers: ``<event>/<name>`` (``eval_loss`` of an eval record is ``eval/loss``),
    so TensorBoard groups a run's train and eval curves alike; ``metrics.jsonl`` keeps the record's own keys."""
    return f"{event}/{name.removeprefix(event + '_')}"


class RunLogger:
    """metrics.jsonl + trackers + progress bar / plain lines, main process only."""

    def __init__(
        self,
        accelerator,
        metrics: str | Path,
        total_steps: int,
        start_step: int,
        progress: bool,
        use_trackers: bool,
        eval_lines_every: int = 1,
    ):
        self.accelerator = accelerator
        # epochs of a few steps (a small folder) evaluate every few steps: the console shows one [eval] line per
        # ``eval_lines_every`` steps (and the last one); metrics.jsonl and the trackers get every evaluation
        self.eval_lines_every, self.total_steps = eval_lines_every, total_steps
        self._last_eval_line: int | None = None
        self._said_eval_lines = False
        self.is_main = accelerator.is_main_process
        self.path = Path(metrics)  # the run folder's metrics.jsonl (``run_dir.METRICS``)
        self.use_trackers = use_trackers
        if self.is_main:  # a run killed mid-write left half a line: the next record must not be glued to it
            drop_partial_line(self.path, "the metrics log")
        self.interactive = progress and sys.stdout.isatty()
        self.plain_lines = not self.interactive  # no bar: a [train] line per log, whatever --progress says
        self.bar = None
        if self.interactive:
            from accelerate.utils import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
                main_process_only=True,
            )
        self.started = self._t0 = time.perf_counter()  # time_s in metrics.jsonl counts from here

    def event(self, event: str, step: int, epoch: int, **values: Any) -> None:
        if not self.is_main:
            return
        record = {
            "event": event,
            "step": step,
            "epoch": epoch,
            **values,
            "time_s": round(time.perf_counter() - self._t0, 3),
        }  # seconds since the run's logger started
        append_line(self.path, json.dumps(finite(record, str(self.path)), allow_nan=False), "the metrics log")

    def log(self, event: str, step: int, epoch: int, values: dict[str, float]) -> None:
        """Record, send to trackers and display one set of metrics (call on every rank)."""
        self.event(event, step, epoch, **values)
        if self.use_trackers:  # one naming in every tracker: train/loss, eval/loss, eval/ema_accuracy, ...
            self.accelerator.log({tracker_tag(event, k): v for k, v in values.items()}, step=step)
        if not self.is_main:
            return
        if self.bar is not None and event == "train":
            shown = {"loss": f"{values['loss']:.4f}"}
            if "accuracy" in values:  # a classification's
                shown["acc"] = f"{values['accuracy']:.3f}"
            self.bar.set_postfix(**shown, samples_s=f"{values['samples_per_s']:.0f}", refresh=False)
        elif (event == "train" and self.plain_lines) or (event != "train" and self._eval_line_due(step)):
            self.write(_format_line(event, step, epoch, values))

    def _eval_line_due(self, step: int) -> bool:
        last = self._last_eval_line
        every = self.eval_lines_every  # at most one line per block of that many steps: beside its [train] line
        if last is not None and step // every == last // every and step < self.total_steps:
            if not self._said_eval_lines:
                self._said_eval_lines = True
                self.write(
                    f"accel_train: an evaluation every {step - last} step(s) (each epoch); the console shows one "
                    f"[eval] line per {every} steps (--log-every) and the last, metrics.jsonl "
                    "every evaluation"
                )
            return False
        self._last_eval_line = step
        return True

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def write(self, text: str) -> None:
        if not self.is_main:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _format_line(event: str, step: int, epoch: int, values: dict[str, float]) -> str:
    parts = [f"[{event}] step {step} epoch {epoch}"]
    for k, v in values.items():
        parts.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
    return " | ".join(parts)
