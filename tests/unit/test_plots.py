"""Tests for accel_train.plots and scripts/plot_runs.py on fabricated run directories.

The in-process tests; whole runs and launches are in ../integration/test_plots_runs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_train.errors import UserError
from accel_train.plots import plot_confusion_matrix, plot_curves, read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, min_size: tuple[int, int] = (300, 200)) -> None:
    from PIL import Image

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size[0] >= min_size[0] and image.size[1] >= min_size[1], image.size
        # Not a blank canvas: more than one colour.
        extrema = image.convert("L").getextrema()
        assert extrema[0] < extrema[1]


def test_read_metrics_missing_file_is_user_error(tmp_path):
    with pytest.raises(UserError, match="metrics.jsonl"):
        read_metrics(tmp_path / "nope")


@pytest.mark.parametrize("content", ["", "\n\n", '{"event": "resume", "step": 0}\n', '{"event": "tra'])
def test_plot_curves_empty_metrics(tmp_path, content):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "metrics.jsonl").write_text(content)
    assert read_metrics(run).get("train", []) == []
    assert_png(plot_curves(run), min_size=(200, 100))


def test_plot_curves_missing_metrics_file_and_missing_dir(tmp_path):
    run = tmp_path / "starting"
    run.mkdir()
    assert_png(plot_curves(run), min_size=(200, 100))
    with pytest.raises(UserError, match="does not exist"):
        plot_curves(tmp_path / "nope")


def test_plot_confusion_matrix(tmp_path):
    matrix = [[50, 2, 0], [3, 40, 7], [0, 0, 0]]  # an all-zero row must not divide by zero
    out = plot_confusion_matrix(matrix, ["zero", "one", "two"], tmp_path / "cm.png", title="digits")
    assert_png(out, min_size=(300, 300))
    with pytest.raises(ValueError):
        plot_confusion_matrix([[1, 2], [3, 4]], ["a", "b", "c"], tmp_path / "bad.png")


# ---- plot_runs: samples on the x axis when global batches differ; the global batch in the legend ---------------------


def _user_error(fn, *needles: str) -> str:
    with pytest.raises(UserError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def _run(root: Path, name: str, global_batch: int | None, steps_per_epoch: int = 10) -> Path:
    run = root / name
    run.mkdir(parents=True)
    records = [{"event": "train", "step": s, "epoch": 0, "loss": 1.0 / s, "accuracy": 0.5} for s in (5, 10, 20)]
    records.append({"event": "eval", "step": 20, "epoch": 1, "eval_loss": 0.5, "eval_accuracy": 0.9})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if global_batch is not None:
        resolved = f"resolved:\n  global_batch: {global_batch}\n  steps_per_epoch: {steps_per_epoch}\n"
        (run / "config.yaml").write_text("model: lenet\n" + resolved)
    return run


@pytest.fixture
def figures(monkeypatch):
    """The figures ``plot_runs`` would save, kept open for inspection."""
    from accel_train import plots

    saved = []

    def keep(fig, out):
        saved.append(fig)
        return Path(out)

    monkeypatch.setattr(plots, "_save", keep)
    yield saved


def _axis(fig) -> tuple[str, list[str], list[list[float]]]:
    ax = fig.axes[0]  # the train-loss panel
    return (
        ax.get_xlabel(),
        [t.get_text() for t in ax.get_legend().get_texts()],
        [list(ln.get_xdata()) for ln in ax.lines],
    )


def test_plot_runs_overlays_by_samples_when_global_batches_differ(tmp_path, figures):
    from accel_train.plots import plot_runs

    runs = [_run(tmp_path, "b32", 32), _run(tmp_path, "b64", 64, steps_per_epoch=5)]
    plot_runs(runs, tmp_path / "x.png")
    label, legend, xs = _axis(figures[-1])
    assert "samples" in label and "global batches differ" in label
    assert any("global batch 32" in t for t in legend) and any("global batch 64" in t for t in legend)
    assert xs == [[160.0, 320.0, 640.0], [320.0, 640.0, 1280.0]]

    plot_runs(runs, tmp_path / "x.png", x="step")
    label, _, xs = _axis(figures[-1])
    assert label.startswith("optimizer step") and "global batches differ: 32, 64" in label
    assert xs[0] == xs[1] == [5, 10, 20]

    plot_runs(runs, tmp_path / "x.png", x="epoch")
    label, _, xs = _axis(figures[-1])
    assert label.startswith("epoch") and xs == [[0.5, 1.0, 2.0], [1.0, 2.0, 4.0]]


def test_plot_runs_keeps_steps_for_one_global_batch_and_refuses_unknown_batches(tmp_path, figures):
    from accel_train.plots import plot_runs

    same = [_run(tmp_path, "a", 32), _run(tmp_path, "b", 32)]
    plot_runs(same, tmp_path / "x.png")
    label, _, xs = _axis(figures[-1])
    assert label == "optimizer step (global batch 32)" and xs[0] == [5, 10, 20]
    unknown = _run(tmp_path, "old", None)
    _user_error(lambda: plot_runs([same[0], unknown], tmp_path / "x.png", x="samples"), "--x samples", "--x step")
    plot_runs([same[0], unknown], tmp_path / "x.png")  # auto: one known batch does not differ, so steps
    assert _axis(figures[-1])[0].startswith("optimizer step")
