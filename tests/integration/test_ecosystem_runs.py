"""Issue 13: what the libraries already do, used; and where they fall short, shown.

Trackers (any of accelerate's, checked before the run), the metric (no files, no locks, built at first
use), the state-dict helpers (torch/accelerate where they do the job) and the stratified split (datasets).


Whole runs and launches; the in-process tests are in ../unit/test_ecosystem.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST, REPO, SMALL_RUN, _env, check, launch_cmd, metrics, run_here

from accel_train.config import parse_config
from accel_train.errors import UserError

TINY = [
    "--dataset", "synthetic", "--synthetic-size", "128", "--synthetic-test-size", "96",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16", "--no-plots", "--no-progress",
]  # fmt: skip


def _run(script: str, *args: str, config: str | None = None, env: dict[str, str] | None = None):
    """``run_script`` with MLflow's own settings taken out of the environment (they would redirect the run)."""
    base = {k: v for k, v in _env(env).items() if not k.startswith("MLFLOW_")}
    cmd = launch_cmd(script, *args, config=config)
    return subprocess.run(cmd, cwd=REPO, env=base, capture_output=True, text=True, timeout=600)


def _files(*roots: Path) -> set[Path]:
    return {p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()}


def test_a_tracker_without_its_package_is_one_line_naming_it_before_the_run(tmp_path, monkeypatch):
    import accelerate.tracking

    from accel_train.loop import fit

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    for tracker, package in (("mlflow", "mlflow"), ("comet_ml", "comet-ml"), ("tensorboard", "tensorboard")):
        with pytest.raises(UserError, match=f"--report-to {tracker} needs the {package} package: pip install"):
            parse_config(["--report-to", f"csv,{tracker}"])
    # a resumed run may bring its report_to back from the checkpoint: fit checks again, before any folder exists
    cfg = dataclasses.replace(parse_config([*SMALL_RUN, "--output-dir", str(tmp_path / "run")]), report_to="mlflow")
    with pytest.raises(UserError, match="pip install mlflow"):
        fit(cfg)
    assert not (tmp_path / "run").exists()


def test_report_to_mlflow_logs_the_run_into_the_run_folder(tmp_path, monkeypatch):
    """MLflow (accelerate's tracker) next to the CSV one: the same values as metrics.jsonl, in <run>/mlruns."""
    pytest.importorskip("mlflow", reason="pip install mlflow-skinny (requirements-dev.txt)")
    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:  # they would redirect the run
        monkeypatch.delenv(name)
    out = tmp_path / "run"
    check(
        run_here(
            "train.py",
            *TINY,
            "--max-steps",
            "6",
            "--log-every",
            "3",
            "--report-to",
            "mlflow,csv",
            "--output-dir",
            str(out),
        )
    )
    store = out / "mlruns"
    [run] = [p.parent for p in store.glob("*/*/meta.yaml") if p.parent.parent.name != "0"]
    meta = (run / "meta.yaml").read_text()
    assert "run_name: run" in meta and "status: 3" in meta  # 3: FINISHED
    experiment = (run.parent / "meta.yaml").read_text()
    assert "name: accel_train" in experiment

    def logged(name: str) -> list[tuple[int, float]]:  # MLflow's file store: "<timestamp> <value> <step>" lines
        return [
            (int(s), float(v))
            for _, v, s in (line.split() for line in (run / "metrics" / name).read_text().splitlines())
        ]

    records = metrics(out)
    evals = [(r["step"], r["eval_accuracy"]) for r in records if r["event"] == "eval"]
    trains = [(r["step"], r["loss"]) for r in records if r["event"] == "train"]

    def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:  # pytest >= 9.1: no nested approx
        return [s for s, _ in a] == [s for s, _ in b] and [v for _, v in a] == pytest.approx([v for _, v in b])

    assert evals and same(logged("eval/accuracy"), evals)
    assert [s for s, _ in trains] == [3, 6] and same(logged("train/loss"), trains)
    assert "eval/accuracy" in (out / "metrics.csv").read_text().splitlines()[0]
    assert not (out / "tb").exists() and not (REPO / "mlruns").exists()


def _hf_env(root: Path) -> dict[str, str]:
    """Every cache the HF libraries write to, under ``root`` (whatever the user's environment says)."""
    names = ("HF_HOME", "HF_EVALUATE_CACHE", "HF_METRICS_CACHE", "HF_MODULES_CACHE", "HF_DATASETS_CACHE")
    return {name: str(root / name.lower()) for name in names}


def test_evaluate_load_with_its_defaults_writes_cache_and_lock_files(tmp_path):
    """The control for the test below: the counting sees what ``evaluate.load`` + compute leave behind."""
    script = (
        "import evaluate, sys; m = evaluate.load(sys.argv[1]); "
        "m.add_batch(predictions=[1, 0], references=[1, 1]); print(m.compute())"
    )
    path = REPO / "accel_train" / "metrics" / "accuracy" / "accuracy.py"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=_env(_hf_env(tmp_path)), capture_output=True, text=True
    )
    check(proc)
    written = {p.name for p in _files(tmp_path)}
    assert "accuracy.py" in written and "default_experiment-1-0.arrow.lock" in written, written


def test_two_process_run_and_evaluation_write_no_metric_files(tmp_path):
    """Two gloo ranks evaluate at steps 2, 4 and 6 while training, then ``eval.py`` on 2 ranks: no cache or lock file
    anywhere in the HF caches, and the evaluation writes nothing but its report."""
    env = _hf_env(tmp_path / "hf")
    out = tmp_path / "run"
    args = [*TINY, *FAST, "--max-steps", "6", "--eval-every", "2", "--output-dir", str(out)]
    check(_run("train.py", *args, config="multi_cpu.yaml", env=env))
    assert {r["step"] for r in metrics(out) if r["event"] == "eval"} == {2, 4, 6}
    assert _files(tmp_path / "hf") == set()
    assert not [p for p in _files(out) if p.suffix in (".arrow", ".lock") and p.name != ".lock"]  # .lock: the run's

    before = _files(tmp_path)
    report = tmp_path / "eval.json"
    proc = check(
        _run("eval.py", "--weights", str(out / "model"), "--out", str(report), config="multi_cpu.yaml", env=env)
    )
    written = json.loads(report.read_text())
    assert written["world_size"] == 2 and f"on {written['samples']} samples" in proc.stdout
    assert _files(tmp_path) - before == {report}
    assert _files(tmp_path / "hf") == set()
    # the same weights on 1 process: the same mean loss over the same samples (not one rank's share of it)
    single = tmp_path / "eval_one.json"
    check(run_here("eval.py", "--weights", str(out / "model"), "--out", str(single)))
    one = json.loads(single.read_text())
    assert one["world_size"] == 1 and one["samples"] == written["samples"]
    assert written["loss"] == pytest.approx(one["loss"], rel=1e-5) and written["accuracy"] == one["accuracy"]


def test_loading_the_metric_does_not_import_evaluate():
    """``load_metric`` is cheap at start-up; ``evaluate`` (datasets, scipy.stats) is imported at the first use."""
    script = (
        "import sys; from accel_train.metrics import load_metric; m = load_metric('accuracy'); "
        "assert 'evaluate' not in sys.modules and 'datasets' not in sys.modules, 'imported at load'; "
        "m.add_batch(predictions=[1, 0, 2], references=[1, 1, 2]); print(m.compute()['accuracy']); "
        "print('evaluate' in sys.modules)"
    )
    proc = check(subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, cwd=REPO))
    assert proc.stdout.split() == [str(2 / 3), "True"]
    with pytest.raises(ValueError, match="no local metric"):
        from accel_train.metrics import load_metric

        load_metric("bleu")
