"""What the user sees and keeps of a run: metrics.jsonl, trackers, progress.

Only the main process writes or prints. ``metrics.jsonl`` is always written;
TensorBoard and CSV go through ``accelerator.init_trackers``/``accelerator.log``.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker, on_main_process

from accel_train.fsio import append_line


class CSVTracker(GeneralTracker):
    """A minimal accelerate tracker writing ``metrics.csv`` (one row per log call)."""

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike):
        super().__init__()
        self.run_name = run_name
        self.path = Path(logging_dir) / "metrics.csv"
        self._fields: list[str] = []
        self._rows: list[dict[str, Any]] = []

    @property
    def tracker(self):
        return self.path

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        pass  # config.yaml already holds it

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        row = {"step": step, **{k: v for k, v in values.items() if isinstance(v, (int, float))}}
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


def trackers_for(report_to: str, output_dir: str) -> list:
    if report_to == "none":
        return []
    names = ["tensorboard", "csv"] if report_to == "all" else [report_to]
    return [CSVTracker("accel_train", output_dir) if n == "csv" else n for n in names]


class RunLogger:
    """metrics.jsonl + trackers + progress bar / plain lines, main process only."""

    def __init__(
        self, accelerator, output_dir: str | Path, total_steps: int, start_step: int, progress: bool, use_trackers: bool
    ):
        self.accelerator = accelerator
        self.is_main = accelerator.is_main_process
        self.path = Path(output_dir) / "metrics.jsonl"
        self.use_trackers = use_trackers
        self.interactive = progress and sys.stdout.isatty()
        self.plain_lines = progress and not self.interactive
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
        append_line(self.path, json.dumps(record), "the metrics log")

    def log(self, event: str, step: int, epoch: int, values: dict[str, float]) -> None:
        """Record, send to trackers and display one set of metrics (call on every rank)."""
        self.event(event, step, epoch, **values)
        if self.use_trackers:
            prefix = "" if event == "eval" else f"{event}/"
            self.accelerator.log({f"{prefix}{k}": v for k, v in values.items()}, step=step)
        if not self.is_main:
            return
        if self.bar is not None and event == "train":
            self.bar.set_postfix(
                loss=f"{values['loss']:.4f}",
                acc=f"{values['accuracy']:.3f}",
                samples_s=f"{values['samples_per_s']:.0f}",
                refresh=False,
            )
        elif self.plain_lines or event != "train":
            self.write(_format_line(event, step, epoch, values))

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
