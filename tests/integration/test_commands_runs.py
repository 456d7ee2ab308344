"""Issue 15, findings 7 and 8: evaluation on a test split alone, plot axes, --help, the step schedule's
settings, epoch labels, file modes, convert --overwrite, quiet image folders.

In-process where possible (``accel_train.loop.fit``, ``run_evaluation``, the commands' ``main``), so
each test costs about a second.


Whole runs and launches; the in-process tests are in ../unit/test_commands.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import fit_small
from datafiles import MNIST_NAMES, write_mnist_idx

from accel_train.config import parse_config
from accel_train.errors import UserError


def _fit(out: Path, *args: str) -> dict:
    return fit_small(out, "--synthetic-size", "64", "--synthetic-test-size", "32", *args)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]


def _user_error(fn, *needles: str) -> str:
    with pytest.raises(UserError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def _mnist_export(path: Path) -> Path:
    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28, "dataset": "mnist"}
    export_weights(create_model("lenet").state_dict(), path, {**config, "mean": [0.1307], "std": [0.3081]})
    return path


def test_eval_scores_mnist_from_the_t10k_files_alone(tmp_path):
    from accel_train.saved_eval import run_evaluation

    raw = write_mnist_idx(tmp_path / "data", n_train=40, n_test=20)
    for name in MNIST_NAMES["train"]:
        (raw / name).unlink()
    export = _mnist_export(tmp_path / "export")
    report = run_evaluation(str(export), data_dir=str(tmp_path / "data"), out=str(tmp_path / "eval.json"))
    assert report["samples"] == 20 and report["dataset"] == "mnist"
    assert json.loads((tmp_path / "eval.json").read_text())["samples"] == 20

    # training still needs (and names) the train files, and keeps suggesting its own --download
    train = parse_config(["--dataset", "mnist", "--data-dir", str(tmp_path / "data")])
    from accel_train.data import build_dataset

    _user_error(lambda: build_dataset(train.data_config()), "missing: train-images-idx3-ubyte", "with --download")


def test_eval_errors_suggest_no_flag_eval_lacks(tmp_path):
    from accel_train.saved_eval import run_evaluation

    export = _mnist_export(tmp_path / "export")
    message = _user_error(
        lambda: run_evaluation(str(export), data_dir=str(tmp_path / "none")),
        "missing: t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte",
        "train.py --download",
    )
    assert "train-images" not in message and "Pass --download" not in message

    raw = write_mnist_idx(tmp_path / "data")
    (raw / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x99" + b"\x00" * 12)
    _user_error(
        lambda: run_evaluation(str(export), data_dir=str(tmp_path / "data")),
        "corrupt IDX header",
        "re-download with train.py --download",
    )

    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    bare = tmp_path / "bare"
    export_weights(create_model("lenet").state_dict(), bare, None)  # no config.json: the model is unknown
    message = _user_error(lambda: run_evaluation(str(bare)), "does not record its model", "convert_checkpoint.py")
    assert "e.g. --model" not in message


def test_eval_has_the_hf_column_flags_its_errors_name(capsys):
    from accel_train.commands import evaluate

    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    text = capsys.readouterr().out
    assert "--image-column" in text and "--label-column" in text and "--download" not in text


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


def test_plot_runs_command_takes_x_and_tables_the_global_batch(tmp_path, capsys, figures):
    from accel_train.commands.plot_runs import main

    runs = [_run(tmp_path, "b32", 32), _run(tmp_path, "b64", 64)]
    assert main([*map(str, runs), "--out", str(tmp_path / "c.png"), "--x", "epoch"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].rstrip().endswith("| global batch |")
    assert table[2].rstrip().endswith("| 32 |") and table[3].rstrip().endswith("| 64 |")
    assert _axis(figures[-1])[0].startswith("epoch")
    _user_error(lambda: main([str(runs[0]), "--x", "time"]), "--x", "invalid choice")


def test_a_run_applies_and_checkpoints_its_milestones(tmp_path):
    out = tmp_path / "run"
    _fit(out, "--lr-schedule", "step", "--lr-milestones", "0.25", "--lr-gamma", "0.5", "--max-steps", "8")
    lrs = [r["lr"] for r in _records(out) if r["event"] == "train"]
    assert lrs == pytest.approx([2e-3] + [1e-3] * 7)  # after step 2 of 8 (25%): x0.5
    progress = json.loads(next((out / "checkpoints").iterdir()).joinpath("progress.json").read_text())
    assert progress["scheduler"]["lr_lambdas"][0]["milestones"] == [0.25]
    assert progress["scheduler"]["lr_lambdas"][0]["gamma"] == 0.5
    assert "lr_milestones: '0.25'" in (out / "config.yaml").read_text()


def test_train_eval_and_checkpoint_records_agree_on_the_epoch(tmp_path):
    out = tmp_path / "run"
    _fit(out, "--epochs", "2", "--eval-every", "2")  # 64 samples / 16 = 4 steps per epoch
    records = _records(out)
    labelled = [r for r in records if r["event"] in ("train", "eval", "checkpoint")]
    assert {r["event"] for r in labelled} == {"train", "eval", "checkpoint"}
    for r in labelled:
        assert r["epoch"] == (r["step"] - 1) // 4, r
    epoch_ends = [r for r in records if r["event"] == "epoch"]
    assert [(r["step"], r["epoch"]) for r in epoch_ends] == [(4, 1), (8, 2)]  # epochs completed


def test_convert_refuses_an_existing_export_without_overwrite(tmp_path):
    from accel_train.commands.convert import main
    from accel_train.models import create_model

    source = tmp_path / "model.pt"
    torch.save(create_model("lenet").state_dict(), source)
    out = tmp_path / "export"
    args = [str(source), "--out", str(out), "--model", "lenet"]
    assert main(args) == 0
    before = (out / "model.safetensors").read_bytes()
    torch.save(create_model("lenet").state_dict(), source)  # other weights (a new random init)
    _user_error(lambda: main(args), f"--out {out} already holds an export", "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before
    assert main([*args, "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != before
