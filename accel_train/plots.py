"""Plots of training run directories (curves, several runs overlaid, a confusion matrix).

A run directory holds ``metrics.jsonl`` (one JSON object per line, ``event`` is
``"train"``, ``"eval"`` or something to ignore), ``summary.json`` and
``config.yaml``. Everything here reads those files only, so it works on a run
that is still going (a half-written last line is skipped) and on finished runs.

matplotlib is imported inside the functions so that ``import accel_train.plots`` stays cheap, and
only its object-oriented part (``matplotlib.figure.Figure``, drawn by the Agg canvas): ``pyplot``,
its backend machinery and its global figure list cost a run about half a second and hold nothing a
file needs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from accel_train.errors import UserError
from accel_train.fsio import writing
from accel_train.run_dir import METRICS as METRICS_FILE
from accel_train.run_records import (  # noqa: F401 (compare_runs_table, read_metrics: the public API stays here too)
    _default_label,
    _read_config,
    _read_summary,
    _run_info,
    _title,
    choose_x_axis,
    compare_runs_table,
    read_metrics,
    run_batching,
)

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


def new_figure(**kwargs):
    """A ``matplotlib.figure.Figure`` on the Agg canvas (no display, no pyplot), imported at the first plot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out: Path) -> Path:
    """Save ``fig`` to ``out`` atomically (a viewer never sees half a PNG)."""
    out = Path(os.path.realpath(Path(out).expanduser()))  # where a link leads: the link itself stays
    fmt = out.suffix.lstrip(".").lower() or "png"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with writing(out, "the image"):  # a full or read-only disk: one line
            out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight")
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _maybe_log_scale(ax, values: Sequence[float]) -> None:
    """A loss that spans more than 50x goes on a log axis, its decades labelled as plain numbers (0.01, 0.1, 1).

    matplotlib's default log labels are mathtext (``$10^{-2}$``), whose parser costs the first plot of a
    run about a second; plain labels read the same to a person and cost nothing.
    """
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


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

    train_loss = _series(train, "loss")
    eval_loss = _series(evals, "eval_loss")
    eval_acc = _series(evals, "eval_accuracy")
    train_acc = _series(train, "accuracy")

    others = _other_metrics(evals) if not eval_acc[0] else {}  # a task scored otherwise: eval_f1, eval_mse, ...
    if not (train_loss[0] or eval_loss[0] or eval_acc[0] or train_acc[0] or others):
        fig = new_figure(figsize=(7, 3.5))
        ax = fig.subplots()
        ax.set_axis_off()
        _note(ax, "no metrics yet")
        fig.suptitle(title, fontsize=12)
        return _save(fig, out)

    fig = new_figure(figsize=(12, 4.5))
    ax_loss, ax_acc = fig.subplots(1, 2)

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

    if others:
        _plot_metrics(ax_acc, others)
    else:
        _plot_accuracy(ax_acc, train_acc, eval_acc)

    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return _save(fig, out)


def _plot_accuracy(ax_acc, train_acc, eval_acc) -> None:
    """The right panel of an image classifier's run: eval accuracy, and train accuracy lighter."""
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


def _other_metrics(evals: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """The eval records' metrics other than loss and accuracy (the generic task's ``metrics=``), by key."""
    skip = {"eval_loss", "eval_samples", "eval_accuracy"}
    keys = dict.fromkeys(k for r in evals for k in r if k.startswith("eval_") and k not in skip and "_ema_" not in k)
    return {k: series for k in keys if (series := _series(evals, k))[0]}


def _plot_metrics(ax, series: dict[str, tuple[list[float], list[float]]]) -> None:
    for key, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.5, label=key)
        ax.annotate(f"{ys[-1]:.4g}", xy=(xs[-1], ys[-1]), xytext=(-6, -14), textcoords="offset points", ha="right",
                    fontsize=9)  # fmt: skip
    ax.legend(loc="best")
    ax.set_title("Eval metrics")
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)


def _check_runs(run_dirs: list[Path], labels: Sequence[str] | None) -> list[str]:
    """The legend labels of ``run_dirs`` (``labels`` or the defaults), after checking every run has metrics."""
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
    return labels


def _x_scale(axis: str, run_dir: Path) -> float:
    """What one optimizer step of ``run_dir`` is worth on ``axis`` (checked by ``choose_x_axis``)."""
    batching = run_batching(run_dir)
    if axis == "samples":
        return float(batching["global_batch"] or 1)
    if axis == "epoch":
        return 1.0 / (batching["steps_per_epoch"] or 1)
    return 1.0


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
    metric: str | Sequence[str] = DEFAULT_RUN_METRICS,
    x: str | None = None,
) -> Path:
    """Overlay several runs, one colour per run, one panel per metric.

    ``metric`` is a metric name or a sequence of them; ``eval_*`` names are read
    from eval events, others (``loss``, ``accuracy``, ``lr``, ``samples_per_s``)
    from train events. The default label of a run is its directory name plus
    ``(distributed_type/world_size/mixed_precision)`` from its summary.json; every
    legend entry also shows the run's global batch. ``x`` is the x axis: ``step``,
    ``samples`` (step x global batch) or ``epoch``; None picks ``samples`` when the
    runs' global batches differ, else ``step`` (see :func:`choose_x_axis`; the axis
    label says which). Raises :class:`UserError` if a run directory has no
    metrics.jsonl or the number of labels does not match.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise UserError("no run directories given")
    metrics_list = [metric] if isinstance(metric, str) else list(metric)
    if not metrics_list:
        raise UserError("no metric to plot")
    labels = _check_runs(run_dirs, labels)
    axis, xlabel = choose_x_axis(run_dirs, x)
    scales = [_x_scale(axis, d) for d in run_dirs]
    batches = [run_batching(d)["global_batch"] for d in run_dirs]
    labels = [f"{lbl} [global batch {b}]" if b else lbl for lbl, b in zip(labels, batches, strict=True)]
    runs = [read_metrics(d) for d in run_dirs]

    from matplotlib import rcParams

    n = len(metrics_list)
    fig = new_figure(figsize=(5.2 * n, 4.5))
    axes = fig.subplots(1, n, squeeze=False)
    colors = rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for ax, name in zip(axes[0], metrics_list, strict=True):
        drawn: list[float] = []
        for i, (label, metrics) in enumerate(zip(labels, runs, strict=True)):
            xs, ys = _series(metrics.get(_event_for(name), []), name)
            if not xs:
                continue
            is_eval = _event_for(name) == "eval"
            ax.plot(
                [step * scales[i] for step in xs],
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
        ax.set_xlabel(xlabel)
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
    names = [str(c).encode("utf-8", "backslashreplace").decode("utf-8") for c in class_names]  # any folder's bytes
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"confusion matrix must be square, got shape {counts.shape}")
    if counts.shape[0] != len(names):
        raise ValueError(f"confusion matrix is {counts.shape[0]}x{counts.shape[0]} but got {len(names)} class names")
    n = counts.shape[0]
    row_sums = counts.sum(axis=1, keepdims=True).astype(float)
    norm = np.divide(counts, row_sums, out=np.zeros(counts.shape, dtype=float), where=row_sums > 0)

    side = min(max(4.5, 0.55 * n + 2.5), 24)
    fig = new_figure(figsize=(side + 1.2, side))
    ax = fig.subplots()
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
