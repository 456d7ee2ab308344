"""Tests for accel_train.plots and scripts/plot_runs.py on fabricated run directories.

The in-process tests; whole runs and launches are in ../integration/test_plots_runs.py.
"""

from __future__ import annotations

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
