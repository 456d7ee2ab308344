"""Issue 51: any model, any task, the same loop: a text classifier (a Hugging Face BERT built from a config, on a
tokenized ``datasets.Dataset``) and a regression keep every guarantee, through real processes (gloo on CPU).

Two launches of tests/task_train.py run every case (one process, then two under multi_cpu.yaml); the tests compare
what they wrote. The unit tests of the task layer are in test_task_layer.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, check, launch_cmd, metrics, summary, weights

from accel_train.doctor.launching import child_env

pytest.importorskip("transformers")

SCRIPT = str(REPO / "tests" / "task_train.py")
ONE = "text-sgd,text-bitwise,text-straight,text-stop,text-resume,text-auto,text-tb,reg-sgd,reg-bitwise,reg-straight,"
ONE += "reg-stop,reg-resume,reg-long"
TWO = "text-sgd,text-bitwise,reg-sgd,reg-bitwise"


def _launch(out: Path, cases: str, config: str | None) -> subprocess.CompletedProcess:
    cmd = launch_cmd(SCRIPT, str(out), cases, config=config)
    return check(subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=900))


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("one")
    return out, _launch(out, ONE, None)


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("two")
    return out, _launch(out, TWO, "multi_cpu.yaml")


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


def _equal(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("task", ["text", "reg"])
def test_one_and_two_processes_train_the_same_weights_at_the_same_global_batch(one, two, task):
    """SGD, global batch 16: 16 on one process, 8 + 8 on two; nn.Dropout on (keyed on each sample)."""
    (o1, _), (o2, _) = one, two
    s1, s2 = summary(o1 / f"{task}-sgd"), summary(o2 / f"{task}-sgd")
    assert (s1["world_size"], s2["world_size"], s1["global_batch"], s2["global_batch"]) == (1, 2, 16, 16)
    assert _max_diff(o1 / f"{task}-sgd", o2 / f"{task}-sgd") < 1e-5


@pytest.mark.parametrize("task", ["text", "reg"])
def test_bitwise_one_process_accumulating_equals_two_processes_with_dropout_on(one, two, task):
    """1 x 2 micro-batches of 8 vs 2 x 1: the same bits; the BERT's attention dropout (drawn inside
    scaled_dot_product_attention) and its nn.Dropout layers on, the regressor's nn.Dropout too."""
    (o1, log1), (o2, _) = one, two
    s1, s2 = summary(o1 / f"{task}-bitwise"), summary(o2 / f"{task}-bitwise")
    assert (s1["accum_steps"], s2["accum_steps"], s1["micro_batch"], s2["micro_batch"]) == (2, 1, 8, 8)
    assert _equal(o1 / f"{task}-bitwise", o2 / f"{task}-bitwise")
    assert not _equal(o1 / f"{task}-bitwise", o1 / f"{task}-sgd")  # dropout changed the run: it was on
    if task == "text":  # the model drew inside forward: said once, keyed on the micro-batch
        assert "draws random numbers inside forward" in log1.stdout


@pytest.mark.parametrize("task", ["text", "reg"])
def test_stop_and_resume_equal_a_straight_run(one, task):
    out, _ = one
    resumed = metrics(out / f"{task}-stop")
    assert [r["step"] for r in resumed if r["event"] == "resume"] == [5]
    assert summary(out / f"{task}-stop")["global_step"] == 12
    assert _equal(out / f"{task}-straight", out / f"{task}-stop")
    straight = [r for r in metrics(out / f"{task}-straight") if r["event"] == "eval"]
    again = [r for r in resumed if r["event"] == "eval"]
    keys = [k for k in straight[-1] if k.startswith("eval_")]
    assert [[r[k] for k in keys] for r in straight] == [[r[k] for k in keys] for r in again]


def _text_eval_set():
    sys.path.insert(0, str(REPO / "tests"))
    import task_train

    return task_train.text_data(0.1)


def _independent_text(run: Path) -> dict[str, float]:
    """The exported weights in a fresh BERT, scored on the whole eval set in this process, by scikit-learn."""
    from sklearn.metrics import f1_score
    from torch.utils.data import DataLoader

    _, test, collate, build = _text_eval_set()
    model = build()
    model.load_state_dict(weights(run), strict=True)  # unwrapped: a fresh module takes them as they are
    model.eval()
    preds, refs = [], []
    with torch.no_grad():
        for batch in DataLoader(test, batch_size=len(test), collate_fn=collate):
            preds.append(model(**batch).logits.argmax(-1))
            refs.append(batch["labels"])
    p, r = torch.cat(preds).numpy(), torch.cat(refs).numpy()
    return {"eval_accuracy": float((p == r).mean()), "eval_f1": float(f1_score(r, p)), "n": len(r)}


def _independent_reg(run: Path) -> dict[str, float]:
    sys.path.insert(0, str(REPO / "tests"))
    import task_train

    _, test, _, build = task_train.reg_data()
    model = build()
    model.load_state_dict(weights(run), strict=True)
    model.eval()
    x, y = test.tensors
    with torch.no_grad():
        pred = model(x).squeeze(-1).double().numpy()
    err = pred - y.double().numpy()
    return {"eval_mse": float(np.mean(err**2)), "eval_mae": float(np.mean(np.abs(err))), "n": len(y)}


def test_text_metrics_on_two_processes_equal_an_independent_computation(two):
    """81 eval sentences on 2 processes (blocks of 40 and 41): every sentence scored once."""
    out, _ = two
    s = summary(out / "text-sgd")
    want = _independent_text(out / "text-sgd")
    assert s["eval_samples"] == want["n"] == 81
    assert s["eval_accuracy"] == want["eval_accuracy"] and s["eval_f1"] == pytest.approx(want["eval_f1"], abs=1e-12)
    final = [r for r in metrics(out / "text-sgd") if r["event"] == "eval"][-1]
    assert final["eval_f1"] == s["eval_f1"] and final["eval_samples"] == 81


def test_regression_metrics_on_two_processes_equal_an_independent_computation(two):
    out, _ = two
    s = summary(out / "reg-sgd")
    want = _independent_reg(out / "reg-sgd")
    assert s["eval_samples"] == want["n"] == 43
    assert s["eval_mse"] == pytest.approx(want["eval_mse"], rel=1e-6)
    assert s["eval_mae"] == pytest.approx(want["eval_mae"], rel=1e-6)
    assert s["eval_loss"] == pytest.approx(want["eval_mse"], rel=1e-6)  # the default loss of float targets: MSE
    assert s["best_eval_mse"] <= s["eval_mse"]  # lower is better: best/ holds the lowest
    config = json.loads((out / "reg-sgd" / "model" / "config.json").read_text())
    assert (config["task"], config["monitor"], config["mode"]) == ("regression", "eval_mse", "min")


def test_auto_device_batch_probes_dict_batches(one):
    out, _ = one
    s = summary(out / "text-auto")
    assert s["micro_batch"] * s["accum_steps"] == 16 and s["global_step"] == 12


def test_trackers_plots_and_early_stopping_follow_the_metrics(one):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = one
    run = out / "text-tb"
    events = [str(p) for p in (run / "tb").rglob("events.out.tfevents.*")]
    tags = set()
    for path in events:
        acc = EventAccumulator(path)
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"eval/accuracy", "eval/f1", "eval/loss", "train/loss", "train/accuracy"} <= tags
    assert (run / "curves.png").stat().st_size > 0 and not (run / "confusion_matrix.png").exists()
    s = summary(run)
    # patience 1 on eval_accuracy every 6 steps: stopped early or ran to the end, and said which
    assert s["best_eval_accuracy"] is not None and ("stopped" not in s or "eval_accuracy" in s["stopped"])


def test_sigterm_at_a_step_boundary_then_resume_equals_a_straight_run(one, tmp_path):
    """A real SIGTERM once the run has logged its first train record: exit 143 at a step boundary with a
    checkpoint; the resume ends with the straight run's weights."""
    out, _ = one
    env = child_env({"TASK_STEP_SLEEP_S": "0.2"})
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(tmp_path), "reg-term"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    log = tmp_path / "reg-term" / "metrics.jsonl"
    for line in proc.stdout:
        if log.is_file() and '"event": "train"' in log.read_text():
            break
        if "[train]" in line:  # the console's line comes right after the record
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, rest
    stopped = [r for r in metrics(tmp_path / "reg-term") if r["event"] == "checkpoint"][-1]["step"]
    assert 10 <= stopped < 30
    check(subprocess.run([sys.executable, SCRIPT, str(tmp_path), "reg-termresume"], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=300))  # fmt: skip
    assert summary(tmp_path / "reg-term")["global_step"] == 30
    assert _equal(out / "reg-long", tmp_path / "reg-term")


def test_text_example_runs_on_two_processes(tmp_path):
    """examples/text_classification.py --tiny on a CSV of real sentences, as a user launches it."""
    sys.path.insert(0, str(REPO / "tests"))
    import csv

    import task_train

    data = tmp_path / "sentences.csv"
    with data.open("w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *task_train.sentences()])
    cmd = launch_cmd(str(REPO / "examples" / "text_classification.py"), "--tiny", "--csv", str(data), "--epochs",
                     "1", config="multi_cpu.yaml")  # fmt: skip
    check(subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600))
    s = summary(tmp_path / "runs" / "text_classification")
    assert s["world_size"] == 2 and {"eval_accuracy", "eval_f1", "eval_loss"} <= set(s)
    assert s["eval_samples"] == math.ceil(len(task_train.sentences()) * 0.25)  # datasets rounds the test split up


def test_regression_example_runs_on_two_processes(tmp_path):
    cmd = launch_cmd(str(REPO / "examples" / "regression.py"), config="multi_cpu.yaml")
    check(subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600))
    s = summary(tmp_path / "runs" / "regression")
    assert s["world_size"] == 2 and s["eval_samples"] == 92
    assert s["eval_r_squared"] > 0.3  # the diabetes data: a linear model reaches about 0.5
    assert os.path.isfile(tmp_path / "runs" / "regression" / "best" / "model.safetensors")
    # run again, as a requeued job would: the example resumes its run (here complete), never starts it over
    check(subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600))
    again = summary(tmp_path / "runs" / "regression")
    assert again["global_step"] == s["global_step"] and again["attempts"] == 2


def test_processes_that_hold_other_samples_are_refused_in_one_line(tmp_path):
    """A split drawn on each process from its own generator: every rank would train and score other samples."""
    cmd = launch_cmd(SCRIPT, str(tmp_path), "reg-ranksdiffer", config="multi_cpu.yaml")
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "process(es) 1 see other samples than process 0" in proc.stdout + proc.stderr
    assert not (tmp_path / "reg-ranksdiffer" / "checkpoints").exists()
