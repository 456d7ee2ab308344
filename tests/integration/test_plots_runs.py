"""Tests for accel_train.plots and scripts/plot_runs.py on fabricated run directories.

Whole runs and launches; the in-process tests are in ../unit/test_plots.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checks import raises_user_error
from helpers_plots import assert_png, global_batch_run, train_loss_axis

from accel_train.errors import UserError
from accel_train.plots import compare_runs_table, plot_curves, plot_runs, read_metrics

REPO = Path(__file__).resolve().parents[2]


def _train(step: int, loss: float, **extra) -> dict:
    record = {
        "event": "train",
        "step": step,
        "epoch": step // 45,
        "loss": loss,
        "accuracy": min(1.0, 0.1 + step / 100),
        "lr": 0.001,
        "samples_per_s": 1000.0 + step,
        "time_s": step * 0.1,
    }
    record.update(extra)
    return record


def _eval(step: int, loss: float, acc: float) -> dict:
    return {
        "event": "eval",
        "step": step,
        "epoch": step // 45,
        "eval_loss": loss,
        "eval_accuracy": acc,
        "eval_samples": 360,
    }


def make_run(
    root: Path,
    name: str,
    *,
    records: list[dict] | None = None,
    summary: dict | None = None,
    config: str | None = None,
    raw_tail: str = "",
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    if records is None:
        records = [_train(s, 2.3 / (1 + s / 10)) for s in range(10, 100, 10)]
        records += [_eval(45, 0.4, 0.9), {"event": "checkpoint", "step": 50, "path": "ckpt"}, _eval(90, 0.2, 0.95)]
    text = "".join(json.dumps(r) + "\n" for r in records) + raw_tail
    (run / "metrics.jsonl").write_text(text)
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (run / "config.yaml").write_text(config)
    return run


SUMMARY = {
    "eval_accuracy": 0.95,
    "eval_loss": 0.2,
    "global_step": 90,
    "wall_time_s": 12.5,
    "distributed_type": "MULTI_CPU",
    "world_size": 2,
    "mixed_precision": "bf16",
    "model": "lenet",
    "dataset": "digits",
}


def test_read_metrics_groups_by_event_and_ignores_others(tmp_path):
    run = make_run(tmp_path, "run")
    metrics = read_metrics(run)
    assert [r["step"] for r in metrics["train"]] == list(range(10, 100, 10))
    assert [r["step"] for r in metrics["eval"]] == [45, 90]
    assert metrics["checkpoint"][0]["step"] == 50  # kept, but plots ignore it


def test_read_metrics_keeps_last_occurrence_after_resume(tmp_path):
    records = [_train(10, 2.0), _train(20, 1.5), _train(30, 1.4), _eval(30, 1.3, 0.5)]
    records += [{"event": "resume", "step": 20, "from": "ckpt-20"}]
    records += [_train(30, 0.9), _eval(30, 0.8, 0.7), _train(40, 0.7)]
    run = make_run(tmp_path, "resumed", records=records)
    metrics = read_metrics(run)
    train = metrics["train"]
    assert [r["step"] for r in train] == [10, 20, 30, 40]
    assert train[2]["loss"] == 0.9
    assert [(r["step"], r["eval_accuracy"]) for r in metrics["eval"]] == [(30, 0.7)]
    assert_png(plot_curves(run))


def test_read_metrics_skips_truncated_last_line(tmp_path):
    run = make_run(tmp_path, "live", raw_tail='{"event": "train", "step": 100, "lo')
    metrics = read_metrics(run)
    assert metrics["train"][-1]["step"] == 90
    assert_png(plot_curves(run))


def test_plot_curves_writes_png_with_title_sources(tmp_path):
    run = make_run(
        tmp_path,
        "cpu",
        summary={k: v for k, v in SUMMARY.items() if k not in ("model", "dataset")},
        config="model:\n  name: lenet\ndata:\n  dataset: digits\n",
    )
    out = plot_curves(run)
    assert out == run / "curves.png"
    assert_png(out, min_size=(800, 300))
    custom = plot_curves(run, out=tmp_path / "plots" / "custom.png")
    assert custom == tmp_path / "plots" / "custom.png"
    assert_png(custom)
    assert not list(run.glob(".*.tmp")), "temporary file left behind"


def test_plot_curves_without_eval_events(tmp_path):
    run = make_run(tmp_path, "early", records=[_train(s, 1.0 / s) for s in (1, 2, 3, 4)])
    assert_png(plot_curves(run))


def test_plot_runs_three_runs(tmp_path):
    runs = [
        make_run(
            tmp_path, "cpu", summary={**SUMMARY, "distributed_type": "NO", "world_size": 1, "mixed_precision": "no"}
        ),
        make_run(tmp_path, "multi_cpu", summary=SUMMARY),
        make_run(tmp_path, "bf16", records=[_train(10, 1.0), _train(20, 0.5)]),  # no eval, no summary
    ]
    out = plot_runs(runs, tmp_path / "out" / "compare.png")
    assert_png(out, min_size=(900, 300))
    labelled = plot_runs(runs, tmp_path / "labelled.png", labels=["a", "b", "c"], metric="eval_accuracy")
    assert_png(labelled)


def test_plot_runs_errors(tmp_path):
    good = make_run(tmp_path, "good")
    empty = tmp_path / "no_metrics"
    empty.mkdir()
    with pytest.raises(UserError, match="no_metrics"):
        plot_runs([good, empty], tmp_path / "x.png")
    with pytest.raises(UserError, match="missing_run"):
        plot_runs([good, tmp_path / "missing_run"], tmp_path / "x.png")
    with pytest.raises(UserError, match="labels"):
        plot_runs([good], tmp_path / "x.png", labels=["a", "b"])
    assert not (tmp_path / "x.png").exists()


def test_default_labels_use_summary(tmp_path):
    from accel_train.plots import _default_label

    assert _default_label(make_run(tmp_path, "multi_cpu", summary=SUMMARY)) == "multi_cpu (MULTI_CPU/2/bf16)"
    assert _default_label(make_run(tmp_path, "bare")) == "bare"


def test_compare_runs_table(tmp_path):
    with_summary = make_run(tmp_path, "multi_cpu", summary={**SUMMARY, "samples_per_s": 2000.0})
    from_metrics = make_run(tmp_path, "bare")
    table = compare_runs_table([with_summary, from_metrics])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("| run | eval accuracy | eval loss | global step")
    assert "| multi_cpu | 0.9500 | 0.2000 | 90 | 12.5 | 2000.0 | 2 | bf16 |" in table
    # No summary: numbers come from the last eval/train records, unknowns are "-".
    assert lines[3].startswith("| bare | 0.9500 | 0.2000 | 90 | 9.0 |")
    assert lines[3].endswith("| - | - |")


def _run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "plot_runs.py"), *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_plot_runs(tmp_path):
    runs = [make_run(tmp_path, name, summary=SUMMARY) for name in ("cpu", "multi_cpu", "bf16")]
    result = _run_script(*map(str, runs), "--labels", "a,b,c", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "runs_compare.png"
    assert_png(out)
    assert "| a | 0.9500 |" in result.stdout
    assert str(out.name) in result.stdout.strip().splitlines()[-1]

    custom = _run_script(str(runs[0]), "--out", "sub/one.png", cwd=tmp_path)
    assert custom.returncode == 0, custom.stderr
    assert_png(tmp_path / "sub" / "one.png")


def test_script_missing_run_dir(tmp_path):
    good = make_run(tmp_path, "good")
    result = _run_script(str(good), str(tmp_path / "does_not_exist"), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "does_not_exist" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs_compare.png").exists()

    debug = _run_script(str(tmp_path / "does_not_exist"), "--debug", cwd=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


# ---- plot_runs --x, and the global batch in its table ----------------------------------------------------------------


def test_plot_runs_command_takes_x_and_tables_the_global_batch(tmp_path, capsys, figures):
    from accel_train.commands.plot_runs import main

    runs = [global_batch_run(tmp_path, "b32", 32), global_batch_run(tmp_path, "b64", 64)]
    assert main([*map(str, runs), "--out", str(tmp_path / "c.png"), "--x", "epoch"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].rstrip().endswith("| global batch |")
    assert table[2].rstrip().endswith("| 32 |") and table[3].rstrip().endswith("| 64 |")
    assert train_loss_axis(figures[-1])[0].startswith("epoch")
    raises_user_error(lambda: main([str(runs[0]), "--x", "time"]), "--x", "invalid choice")
