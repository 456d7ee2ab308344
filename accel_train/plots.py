"""Plots and a comparison table for training run directories.

A run directory holds ``metrics.jsonl`` (one JSON object per line, ``event`` is
``"train"``, ``"eval"`` or something to ignore), ``summary.json`` and
``config.yaml``. Everything here reads those files only, so it works on a run
that is still going (a half-written last line is skipped) and on finished runs.

matplotlib is imported inside the functions (with the Agg backend) so that
``import accel_train.plots`` stays cheap.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from accel_train.errors import UserError

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"

#: The panels :func:`plot_runs` draws by default. ``eval_*`` names come from
#: ``eval`` events, everything else from ``train`` events.
DEFAULT_RUN_METRICS: tuple[str, ...] = ("loss", "eval_loss", "eval_accuracy")

_METRIC_TITLES = {
    "loss": "Train loss",
    "accuracy": "Train accuracy",
    "eval_loss": "Eval loss",
    "eval_accuracy": "Eval accuracy",
    "lr": "Learning rate",
    "samples_per_s": "Throughput (samples/s)",
}

_MISSING = "-"


# --------------------------------------------------------------------------- reading


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


def _event_for(metric: str) -> str:
    return "eval" if metric.startswith("eval_") else "train"


def _series(records: Iterable[dict], key: str) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for record in records:
        step, value = record.get("step"), record.get(key)
        if isinstance(step, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
            xs.append(step)
            ys.append(float(value))
    return xs, ys


# --------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    """Save ``fig`` to ``out`` atomically (a viewer never sees half a PNG) and close it."""
    plt = _pyplot()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fmt = out.suffix.lstrip(".").lower() or "png"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def _maybe_log_scale(ax, values: Sequence[float]) -> None:
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
        ax.set_yscale("log")


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")


def plot_curves(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Plot loss and accuracy vs step for one run; write ``run_dir/curves.png`` (or ``out``).

    Left panel: train loss and eval loss. Right panel: eval accuracy (and train
    accuracy, lighter). Works mid-run: with no eval events yet, or with an
    empty/missing ``metrics.jsonl`` (the figure then says "no metrics yet").
    Raises :class:`UserError` if ``run_dir`` does not exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist")
    out = Path(out) if out is not None else run_dir / "curves.png"
    metrics = read_metrics(run_dir) if (run_dir / METRICS_FILE).is_file() else {}
    train = metrics.get("train", [])
    evals = metrics.get("eval", [])
    title = _title(run_dir)

    plt = _pyplot()
    train_loss = _series(train, "loss")
    eval_loss = _series(evals, "eval_loss")
    eval_acc = _series(evals, "eval_accuracy")
    train_acc = _series(train, "accuracy")

    if not (train_loss[0] or eval_loss[0] or eval_acc[0] or train_acc[0]):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.set_axis_off()
        _note(ax, "no metrics yet")
        fig.suptitle(title, fontsize=12)
        return _save(fig, out)

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))

    if train_loss[0]:
        ax_loss.plot(*train_loss, color="tab:blue", linewidth=1.2, label="train loss")
    if eval_loss[0]:
        ax_loss.plot(*eval_loss, color="tab:orange", marker="o", markersize=4, linewidth=1.5, label="eval loss")
    if train_loss[0] or eval_loss[0]:
        _maybe_log_scale(ax_loss, train_loss[1] + eval_loss[1])
        ax_loss.legend(loc="upper right")
    else:
        _note(ax_loss, "no loss logged yet")
    ax_loss.set_title("Loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)

    if train_acc[0]:
        ax_acc.plot(*train_acc, color="tab:blue", linewidth=1.0, alpha=0.45, label="train accuracy (batch)")
    if eval_acc[0]:
        ax_acc.plot(*eval_acc, color="tab:green", marker="o", markersize=4, linewidth=1.5, label="eval accuracy")
        ax_acc.annotate(
            f"{eval_acc[1][-1]:.4f}",
            xy=(eval_acc[0][-1], eval_acc[1][-1]),
            xytext=(-6, -14),
            textcoords="offset points",
            ha="right",
            fontsize=9,
            color="tab:green",
        )
    if train_acc[0] or eval_acc[0]:
        ax_acc.legend(loc="lower right")
        ax_acc.set_ylim(-0.02, 1.02)
    if not eval_acc[0]:
        _note(ax_acc, "no eval yet")
    ax_acc.set_title("Accuracy")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("accuracy")
    ax_acc.grid(True, alpha=0.3)

    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return _save(fig, out)


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
    metric: str | Sequence[str] = DEFAULT_RUN_METRICS,
) -> Path:
    """Overlay several runs, one colour per run, one panel per metric (vs step).

    ``metric`` is a metric name or a sequence of them; ``eval_*`` names are read
    from eval events, others (``loss``, ``accuracy``, ``lr``, ``samples_per_s``)
    from train events. The default label of a run is its directory name plus
    ``(distributed_type/world_size/mixed_precision)`` from its summary.json.
    Raises :class:`UserError` if a run directory has no metrics.jsonl or the
    number of labels does not match.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise UserError("no run directories given")
    metrics_list = [metric] if isinstance(metric, str) else list(metric)
    if not metrics_list:
        raise UserError("no metric to plot")
    if labels is None:
        labels = [_default_label(d) for d in run_dirs]
    else:
        labels = list(labels)
        if len(labels) != len(run_dirs):
            raise UserError(f"got {len(labels)} labels for {len(run_dirs)} run directories")
    for run_dir in run_dirs:
        if not (run_dir / METRICS_FILE).is_file():
            what = "does not exist" if not run_dir.exists() else f"has no {METRICS_FILE}"
            raise UserError(f"run directory {run_dir} {what}")
    runs = [read_metrics(d) for d in run_dirs]

    plt = _pyplot()
    n = len(metrics_list)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for ax, name in zip(axes[0], metrics_list, strict=True):
        drawn: list[float] = []
        for i, (label, metrics) in enumerate(zip(labels, runs, strict=True)):
            xs, ys = _series(metrics.get(_event_for(name), []), name)
            if not xs:
                continue
            is_eval = _event_for(name) == "eval"
            ax.plot(
                xs,
                ys,
                color=colors[i % len(colors)],
                marker="o" if is_eval else None,
                markersize=3.5,
                linewidth=1.5 if is_eval else 1.1,
                label=label,
            )
            drawn.extend(ys)
        if drawn:
            if "loss" in name:
                _maybe_log_scale(ax, drawn)
            # No fixed 0..1 range: runs that all end near 1.0 must stay distinguishable.
            ax.legend(fontsize=8, loc="lower right" if "accuracy" in name else "upper right")
        else:
            _note(ax, "no data")
        ax.set_title(_METRIC_TITLES.get(name, name))
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"Comparison of {len(run_dirs)} run(s)", fontsize=12)
    fig.tight_layout()
    return _save(fig, Path(out))


def plot_confusion_matrix(
    matrix: Any,
    class_names: Sequence[str],
    out: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """Heatmap of a confusion matrix (rows: true class, columns: predicted).

    Cells show counts; the colour is the count divided by its row total, so
    each row reads as the distribution of predictions for that true class.
    ``matrix`` is anything ``numpy.asarray`` accepts (list, array, CPU tensor).
    """
    import numpy as np

    counts = np.asarray(matrix)
    names = [str(c) for c in class_names]
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"confusion matrix must be square, got shape {counts.shape}")
    if counts.shape[0] != len(names):
        raise ValueError(f"confusion matrix is {counts.shape[0]}x{counts.shape[0]} but got {len(names)} class names")
    n = counts.shape[0]
    row_sums = counts.sum(axis=1, keepdims=True).astype(float)
    norm = np.divide(counts, row_sums, out=np.zeros(counts.shape, dtype=float), where=row_sums > 0)

    plt = _pyplot()
    side = min(max(4.5, 0.55 * n + 2.5), 24)
    fig, ax = plt.subplots(figsize=(side + 1.2, side))
    image = ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    colorbar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label("fraction of true class (row)")

    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    tick_size = 10 if n <= 12 else max(5, 10 - (n - 12) // 4)
    ax.set_xticklabels(names, rotation=45 if max(map(len, names), default=0) > 3 else 0, ha="right", fontsize=tick_size)
    ax.set_yticklabels(names, fontsize=tick_size)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 40:
        integral = np.all(np.equal(np.mod(counts, 1), 0))
        cell_size = 10 if n <= 10 else max(5, 10 - (n - 10) // 3)
        for r in range(n):
            for c in range(n):
                value = counts[r, c]
                text = f"{int(value)}" if integral else f"{value:.2g}"
                ax.text(
                    c,
                    r,
                    text,
                    ha="center",
                    va="center",
                    fontsize=cell_size,
                    color="white" if norm[r, c] > 0.5 else "black",
                )
    total = counts.sum()
    accuracy = float(np.trace(counts) / total) if total else float("nan")
    heading = title or "Confusion matrix"
    ax.set_title(f"{heading}\n(accuracy {accuracy:.4f}, n={total:g})", fontsize=11)
    fig.tight_layout()
    return _save(fig, Path(out))


# --------------------------------------------------------------------------- table


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
    """A markdown table with one row per run: final eval accuracy/loss, steps, time, throughput, topology.

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
            _fmt(_first(summary.get("wall_time_s"), last_train.get("time_s")), ".1f"),
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
        ]
        rows.append([_cell(c) for c in row])

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 6 + ["---"]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
