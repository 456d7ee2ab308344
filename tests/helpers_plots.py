"""Helpers shared by tests/unit/test_plots.py and tests/integration/test_plots_runs.py: PNG checks, fabricated
run folders with a global batch, and the ``figures`` fixture (a plugin of tests/conftest.py: any test can ask
for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def global_batch_run(root: Path, name: str, global_batch: int | None, steps_per_epoch: int = 10) -> Path:
    """A run folder with three train records and one eval; its config.yaml records ``global_batch`` (none: no
    config.yaml, as an old run)."""
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


def train_loss_axis(fig) -> tuple[str, list[str], list[list[float]]]:
    """The train-loss panel's x label, legend texts and each line's x values."""
    ax = fig.axes[0]  # the train-loss panel
    return (
        ax.get_xlabel(),
        [t.get_text() for t in ax.get_legend().get_texts()],
        [list(ln.get_xdata()) for ln in ax.lines],
    )
