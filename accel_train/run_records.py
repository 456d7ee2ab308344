"""Reading run directories: ``metrics.jsonl`` (tolerating a half-written last line), ``summary.json``,
``config.yaml``, a run's label and title, and the comparison table of ``accel-plot-runs``.

File names come from :mod:`accel_train.run_dir`, which owns them.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accel_train.errors import UserError
from accel_train.run_dir import CONFIG as CONFIG_FILE
from accel_train.run_dir import METRICS as METRICS_FILE
from accel_train.run_dir import SUMMARY as SUMMARY_FILE

_MISSING = "-"
#: What ``accel-plot-runs --x`` can put on the x axis.
X_AXES = ("step", "samples", "epoch")


def _metrics_path(run_dir: str | os.PathLike) -> Path:
    path = Path(run_dir)
    return path if path.is_file() else path / METRICS_FILE


def read_metrics(run_dir: str | os.PathLike) -> dict[str, list[dict]]:
    """Read ``metrics.jsonl`` of ``run_dir``, grouped by event name.

    Lines that are blank, not JSON (a truncated last line while the run is still
    writing) or not an object with an ``event`` are skipped. After a resume the
    same step can be logged twice; the last occurrence of each (event, step)
    wins. Each event's records are returned sorted by step (records without a
    step keep their order, after the stepped ones).

    ``run_dir`` may also be the path of the ``metrics.jsonl`` file itself.
    Raises :class:`UserError` if the file does not exist.
    """
    path = _metrics_path(run_dir)
    if not path.is_file():
        raise UserError(f"no {METRICS_FILE} in {Path(run_dir)} (is this a run directory?)")

    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    # Index of the last non-blank line: a bad line there is a write in progress.
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)

    stepped: dict[str, dict[Any, dict]] = {}
    unstepped: dict[str, list[dict]] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i != last:
                warnings.warn(f"{path}:{i + 1}: skipping a line that is not JSON", stacklevel=2)
            continue
        if not isinstance(record, dict) or not isinstance(record.get("event"), str):
            continue
        event = record["event"]
        step = record.get("step")
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            by_step = stepped.setdefault(event, {})
            by_step.pop(step, None)  # re-insert so dict order is the last occurrence
            by_step[step] = record
        else:
            unstepped.setdefault(event, []).append(record)

    grouped: dict[str, list[dict]] = {}
    for event in list(stepped) + [e for e in unstepped if e not in stepped]:
        records = sorted(stepped.get(event, {}).values(), key=lambda r: r["step"])
        grouped[event] = records + unstepped.get(event, [])
    return grouped


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_summary(run_dir: Path) -> dict:
    return _read_json(run_dir / SUMMARY_FILE)


def _read_config(run_dir: Path) -> dict:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        import yaml
    except ImportError:  # the title just gets shorter
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _find(mapping: dict, names: Sequence[str], depth: int = 2) -> Any:
    """First value under one of ``names`` in ``mapping`` or its nested dicts."""
    for name in names:
        value = mapping.get(name)
        if value not in (None, "", {}):
            return value
    if depth > 0:
        for value in mapping.values():
            if isinstance(value, dict):
                found = _find(value, names, depth - 1)
                if found is not None:
                    return found
    return None


def _name_of(value: Any) -> str | None:
    if isinstance(value, dict):
        value = _find(value, ("name", "arch", "type", "id"), depth=0)
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def _run_info(run_dir: Path) -> dict[str, Any]:
    """Model, dataset and topology of a run from summary.json, then config.yaml."""
    summary = _read_summary(run_dir)
    config = _read_config(run_dir)
    info: dict[str, Any] = {}
    for key, names in (
        ("model", ("model", "model_name", "arch")),
        ("dataset", ("dataset", "dataset_name")),
        ("distributed_type", ("distributed_type",)),
        ("world_size", ("world_size", "num_processes")),
        ("mixed_precision", ("mixed_precision", "precision")),
    ):
        for source in (summary, config):
            value = _name_of(_find(source, names))
            if value is not None:
                info[key] = value
                break
    return info


def _title(run_dir: Path) -> str:
    info = _run_info(run_dir)
    parts = [info[k] for k in ("model", "dataset") if k in info]
    topology = [str(info["distributed_type"])] if "distributed_type" in info else []
    if "world_size" in info:
        topology.append(f"{info['world_size']} proc")
    if "mixed_precision" in info:
        topology.append(f"mixed precision: {info['mixed_precision']}")
    if topology:
        parts.append(", ".join(topology))
    return " · ".join(parts) if parts else run_dir.resolve().name


def _default_label(run_dir: Path) -> str:
    name = run_dir.resolve().name or str(run_dir)
    summary = _read_summary(run_dir)
    extra = [
        str(summary[k]) for k in ("distributed_type", "world_size", "mixed_precision") if summary.get(k) is not None
    ]
    return f"{name} ({'/'.join(extra)})" if extra else name


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_batching(run_dir: str | os.PathLike) -> dict[str, int | None]:
    """``global_batch`` and ``steps_per_epoch`` of a run, from config.yaml's ``resolved`` or summary.json.

    None where neither has it (a run from an older version, or one still starting).
    """
    run_dir = Path(run_dir)
    resolved = _read_config(run_dir).get("resolved")
    resolved = resolved if isinstance(resolved, dict) else {}
    summary = _read_summary(run_dir)
    return {
        key: _first(_positive_int(resolved.get(key)), _positive_int(summary.get(key)))
        for key in ("global_batch", "steps_per_epoch")
    }


def choose_x_axis(run_dirs: Sequence[str | os.PathLike], x: str | None = None) -> tuple[str, str]:
    """The x axis to overlay ``run_dirs`` on, and its label (which says why).

    ``x`` None picks ``samples`` when the runs' global batches differ (a step is then not the same amount
    of training), else ``step``. ``samples`` needs every run's global batch, ``epoch`` its steps per epoch.
    """
    if x is not None and x not in X_AXES:
        raise UserError(f"--x {x!r} is not one of: {', '.join(X_AXES)}")
    batching = {Path(d): run_batching(d) for d in run_dirs}
    batches = sorted({b["global_batch"] for b in batching.values() if b["global_batch"] is not None})
    differ = len(batches) > 1
    axis = x or ("samples" if differ else "step")
    need = {"samples": "global_batch", "epoch": "steps_per_epoch"}.get(axis)
    unknown = [str(d) for d, b in batching.items() if need and b[need] is None]
    if unknown:
        raise UserError(
            f"--x {axis} needs each run's {need.replace('_', ' ')} (config.yaml 'resolved' or summary.json); "
            f"{', '.join(unknown)} has none: use --x step"
        )
    shown = ", ".join(map(str, batches))
    if axis == "samples":
        why = "global batches differ" if differ else f"global batch {shown}"
        return axis, f"samples seen (step x global batch; {why})"
    if axis == "epoch":
        return axis, "epoch (step / steps per epoch)"
    if differ:
        return axis, f"optimizer step (global batches differ: {shown})"
    return axis, f"optimizer step (global batch {shown})" if batches else "optimizer step"


def _fmt(value: Any, spec: str) -> str:
    if value is None or isinstance(value, bool):
        return _MISSING if value is None else str(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return str(value)
        if spec == "d" and isinstance(value, float):
            return format(int(value)) if value.is_integer() else format(value, ".1f")
        return format(value, spec)
    return str(value)


def _first(*candidates: Any) -> Any:
    return next((c for c in candidates if c is not None), None)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def compare_runs_table(run_dirs: Sequence[str | os.PathLike], labels: Sequence[str] | None = None) -> str:
    """A markdown table with one row per run: final eval accuracy/loss, steps, time, throughput, topology, batch.

    Numbers come from summary.json; anything missing there is taken from the
    last eval/train record in metrics.jsonl (samples/s: mean over train records),
    and shown as ``-`` if neither has it. Raises :class:`UserError` for a run
    directory that does not exist.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if labels is not None and len(labels) != len(run_dirs):
        raise UserError(f"got {len(labels)} labels for {len(run_dirs)} run directories")
    header = [
        "run",
        "eval accuracy",
        "eval loss",
        "global step",
        "wall time (s)",
        "samples/s",
        "world size",
        "precision",
        "global batch",
    ]
    rows = []
    for i, run_dir in enumerate(run_dirs):
        if not run_dir.is_dir():
            raise UserError(f"run directory {run_dir} does not exist")
        summary = _read_summary(run_dir)
        metrics = read_metrics(run_dir) if (run_dir / METRICS_FILE).is_file() else {}
        last_eval = metrics.get("eval", [{}])[-1]
        train = metrics.get("train", [])
        last_train = train[-1] if train else {}

        throughputs = [r["samples_per_s"] for r in train if isinstance(r.get("samples_per_s"), (int, float))]
        row = [
            labels[i] if labels is not None else (run_dir.resolve().name or str(run_dir)),
            _fmt(_first(summary.get("eval_accuracy"), last_eval.get("eval_accuracy")), ".4f"),
            _fmt(_first(summary.get("eval_loss"), last_eval.get("eval_loss")), ".4f"),
            _fmt(_first(summary.get("global_step"), last_train.get("step"), last_eval.get("step")), "d"),
            _fmt(_first(summary.get("total_wall_time_s"), summary.get("wall_time_s"), last_train.get("time_s")), ".1f"),
            _fmt(
                _first(
                    summary.get("samples_per_s"),
                    summary.get("train_samples_per_s"),
                    sum(throughputs) / len(throughputs) if throughputs else None,
                ),
                ".1f",
            ),
            _fmt(summary.get("world_size"), "d"),
            _fmt(summary.get("mixed_precision"), ""),
            _fmt(run_batching(run_dir)["global_batch"], "d"),
        ]
        rows.append([_cell(c) for c in row])

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 6 + ["---", "---:"]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
