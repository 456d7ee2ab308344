"""Issue 15, findings 7 and 8: evaluation on a test split alone, plot axes, --help, the step schedule's
settings, epoch labels, file modes, convert --overwrite, quiet image folders.

In-process where possible (``accel_train.loop.fit``, ``run_evaluation``, the commands' ``main``), so
each test costs about a second.


The in-process tests; whole runs and launches are in ../integration/test_commands_runs.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from datafiles import write_cifar10, write_image_folder

from accel_train.config import build_parser, parse_config
from accel_train.errors import UserError


def _user_error(fn, *needles: str) -> str:
    with pytest.raises(UserError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def test_cifar10_test_only_needs_only_test_batch(tmp_path):
    from accel_train.data import build_dataset

    directory = write_cifar10(tmp_path, n_per_batch=4, n_test=6)
    (directory / "data_batch_3").unlink()
    cfg = parse_config(["--dataset", "cifar10", "--data-dir", str(tmp_path)]).data_config()
    splits = build_dataset(cfg, test_only=True)
    assert len(splits.test) == 6 and len(splits.train) == 0
    assert splits.train.images.shape[1:] == splits.test.images.shape[1:] == (3, 32, 32)
    _user_error(lambda: build_dataset(cfg), "missing: data_batch_3", "with --download")


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
    plots._pyplot().close("all")


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


def test_help_lists_choices_and_each_default_once():
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    for choices in ("{cosine,constant,linear,step}", "{sgd,adam,adamw}"):
        assert f"{choices}" in text, choices
    # --report-to takes any of accelerate's trackers, comma-separated: a metavar, and the names in its help
    assert "--report-to TRACKERS trackers besides metrics.jsonl: tensorboard, csv, all" in text
    assert "mlflow, wandb" in text and "{tensorboard,csv,none,all}" not in text
    assert "resize images to this size (default: the dataset's own size) --val-split" in text
    assert "(default: cosine)" in text and "(default: 0.5,0.75)" in text
    for action in parser._actions:
        assert (action.help or "").count("(default:") <= 1, action.help
    assert text.count("(default:") == sum("(default:" in (a.help or "") for a in parser._actions)


def test_step_schedule_takes_milestones_and_gamma():
    from accel_train.schedule import ScheduleFn, lr_factor, parse_milestones

    assert [lr_factor(s, 100, "step") for s in (49, 50, 74, 75)] == pytest.approx([1, 0.1, 0.1, 0.01])
    assert [lr_factor(s, 100, "step", 0, [0.2], 0.5) for s in (19, 20, 99)] == pytest.approx([1, 0.5, 0.5])
    assert parse_milestones(" 0.3, 0.6 ,0.9") == (0.3, 0.6, 0.9)
    # old checkpoints' schedule state (no milestones/gamma/warmup_from) loads and keeps the defaults
    fn = ScheduleFn(100, "step", 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), fn)
    state = json.loads(json.dumps(scheduler.state_dict()))
    assert state["lr_lambdas"][0] == {"total_steps": 100, "schedule": "step", "warmup_steps": 0, **_defaults()}
    for key in ("milestones", "gamma", "warmup_from"):
        del state["lr_lambdas"][0][key]
    scheduler.load_state_dict(state)
    assert fn(75) == pytest.approx(0.01)


def _defaults() -> dict:
    return {"milestones": [0.5, 0.75], "gamma": 0.1, "warmup_from": 0.0}


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--lr-milestones", "0.75,0.5"], "milestones must increase"),
        (["--lr-milestones", "0.5,1"], "between 0 and 1"),
        (["--lr-milestones", "half"], "comma-separated numbers"),
        (["--lr-milestones", ""], "at least one"),
        (["--lr-gamma", "0"], "--lr-gamma must be a positive number"),
        (["--lr-gamma", "nan"], "--lr-gamma must be a positive number"),
    ],
)
def test_bad_milestones_and_gamma_are_one_line_errors(flags, needle):
    _user_error(lambda: parse_config(flags), needle)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_atomic_writes_and_exports_follow_the_umask(tmp_path, umask):
    from accel_train.checkpoint.weights import export_weights
    from accel_train.fsio import write_json_atomic
    from accel_train.models import create_model

    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "summary.json", {"a": 1})
        export_weights(create_model("lenet").state_dict(), tmp_path / "model", {"model": "lenet"})
    finally:
        os.umask(old)
    for path in (
        tmp_path / "summary.json",
        tmp_path / "model" / "model.safetensors",
        tmp_path / "model" / "config.json",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_imagefolder_loads_quietly_and_restores_datasets_settings(tmp_path, capfd):
    import datasets

    from accel_train.data import build_dataset

    root = write_image_folder(tmp_path / "images", per_class=4, size=8)
    bars_off, verbosity = datasets.are_progress_bars_disabled(), datasets.utils.logging.get_verbosity()
    cfg = parse_config(["--dataset", f"imagefolder:{root}"]).data_config()
    splits = build_dataset(cfg)
    assert len(splits.train) + len(splits.test) == 12
    captured = capfd.readouterr()
    assert "Downloading data" not in captured.err + captured.out
    assert "Generating train split" not in captured.err + captured.out
    assert datasets.are_progress_bars_disabled() == bars_off
    assert datasets.utils.logging.get_verbosity() == verbosity
