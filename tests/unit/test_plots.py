"""Tests for accel_train.plots and scripts/plot_runs.py on fabricated run directories.

The in-process tests; whole runs and launches are in ../integration/test_plots_runs.py.
"""

from __future__ import annotations

import pytest
from checks import raises_user_error
from helpers_plots import assert_png, global_batch_run, train_loss_axis

from accel_train.errors import UserError
from accel_train.plots import plot_confusion_matrix, plot_curves, read_metrics


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


def test_plot_runs_overlays_by_samples_when_global_batches_differ(tmp_path, figures):
    from accel_train.plots import plot_runs

    runs = [global_batch_run(tmp_path, "b32", 32), global_batch_run(tmp_path, "b64", 64, steps_per_epoch=5)]
    plot_runs(runs, tmp_path / "x.png")
    label, legend, xs = train_loss_axis(figures[-1])
    assert "samples" in label and "global batches differ" in label
    assert any("global batch 32" in t for t in legend) and any("global batch 64" in t for t in legend)
    assert xs == [[160.0, 320.0, 640.0], [320.0, 640.0, 1280.0]]

    plot_runs(runs, tmp_path / "x.png", x="step")
    label, _, xs = train_loss_axis(figures[-1])
    assert label.startswith("optimizer step") and "global batches differ: 32, 64" in label
    assert xs[0] == xs[1] == [5, 10, 20]

    plot_runs(runs, tmp_path / "x.png", x="epoch")
    label, _, xs = train_loss_axis(figures[-1])
    assert label.startswith("epoch") and xs == [[0.5, 1.0, 2.0], [1.0, 2.0, 4.0]]


def test_plot_runs_keeps_steps_for_one_global_batch_and_refuses_unknown_batches(tmp_path, figures):
    from accel_train.plots import plot_runs

    same = [global_batch_run(tmp_path, "a", 32), global_batch_run(tmp_path, "b", 32)]
    plot_runs(same, tmp_path / "x.png")
    label, _, xs = train_loss_axis(figures[-1])
    assert label == "optimizer step (global batch 32)" and xs[0] == [5, 10, 20]
    unknown = global_batch_run(tmp_path, "old", None)
    raises_user_error(lambda: plot_runs([same[0], unknown], tmp_path / "x.png", x="samples"), "--x samples", "--x step")
    plot_runs([same[0], unknown], tmp_path / "x.png")  # auto: one known batch does not differ, so steps
    assert train_loss_axis(figures[-1])[0].startswith("optimizer step")


def test_a_loss_over_decades_is_drawn_on_a_log_axis_labelled_in_plain_numbers(tmp_path, figures):
    """Loss from 2.3 down to 0.004 goes on a log axis whose decades read 0.01, 0.1, 1 (no mathtext, whose parser
    cost the default run half a second); a loss within 50x stays linear."""
    import json

    for name, losses in (("decades", [2.3, 0.5, 0.05, 0.004]), ("narrow", [2.3, 1.5, 0.9, 0.6])):
        run = tmp_path / name
        run.mkdir()
        lines = [{"event": "train", "step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        plot_curves(run)
    wide, narrow = (fig.axes[0] for fig in figures)
    assert wide.get_yscale() == "log" and narrow.get_yscale() == "linear"
    figures[0].canvas.draw()
    labels = [t.get_text() for t in wide.get_yticklabels() if t.get_text()]
    assert {"0.01", "0.1", "1"} <= set(labels), labels
    assert not any("$" in text for text in labels)
    assert not any(t.get_text() for t in wide.yaxis.get_minorticklabels())
