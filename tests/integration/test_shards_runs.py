"""Issue 41, part 2: runs on shards (``--dataset shards:PATH``). Parquet, save_to_disk and WebDataset tar shards
train; 1 and 2 gloo processes train on the same global batches; a run SIGKILLed mid-epoch and resumed with
``--resume auto`` ends bit-identical to a straight run; an undecodable image stops the run with one line naming its
shard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from checks import assert_one_line_error, running
from conftest import (
    FAST,
    REPO,
    _env,
    check,
    fit_here,
    launch_cmd,
    max_abs_diff,
    metrics,
    run_here,
    run_script,
    summary,
    weights,
)
from datafiles import undecodable_png, write_hf_disk
from helpers_shards import shard_set, write_parquet

from accel_train.doctor.launching import child_pids, wait_for_step

SGD = ["--model", "lenet", "--optimizer", "sgd", "--lr", "0.05", "--global-batch-size", "16", "--log-every", "1"]


def _age(root) -> None:
    """Date the shards an hour back: a folder nobody is writing, whose index the first run caches for the rest."""
    then = time.time() - 3600
    for parent, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(parent, name), (then, then))
        os.utime(parent, (then, then))


def _gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while any(running(pid) for pid in pids):
        assert time.time() < deadline, f"DataLoader workers {pids} outlived their killed run"
        time.sleep(0.1)


def _losses(run_dir) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir) if m["event"] == "train"}


@pytest.mark.parametrize("kind, layout", [("parquet", "hub"), ("tar", "folders"), ("save_to_disk", "folders")])
def test_parquet_tar_and_save_to_disk_shards_train(tmp_path, kind, layout):
    if kind == "save_to_disk":  # a DatasetDict as datasets writes it: train/ and test/ of *.arrow files
        root, rows = write_hf_disk(tmp_path / "data", n=96, size=16), "96 train / 32 test"
    else:
        root, rows = shard_set(tmp_path / "data", kind, layout, size=16), "96 train / 12 test"
    out = tmp_path / "run"
    proc = check(run_here("train.py", "--dataset", f"shards:{root}", *SGD, *FAST, "--max-steps", "12",
                          "--output-dir", str(out)))  # fmt: skip
    assert rows in proc.stdout
    done = summary(out)
    assert done["global_step"] == 12 and done["eval_accuracy"] > 0.5  # 3 classes: chance is 1/3
    exported = json.loads((out / "model" / "config.json").read_text())
    assert exported["dataset"] == f"shards:{root}" and len(exported["class_names"]) == 3


def test_one_and_two_processes_train_on_the_same_global_batches(tmp_path):
    """The same shards (6 tars held out by --val-split) on 1 process x 16 and 2 gloo ranks x 8: the same losses at
    every step and the same weights (SGD; only the order of the gradient sums differs)."""
    root = shard_set(tmp_path / "data", "tar", "flat", size=16, shards=6, rows=16)
    _age(root)
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--dataset", f"shards:{root}", *SGD, *FAST, "--max-steps", "12"]  # 76 train rows: 4 steps an epoch
    fit_here(*args, "--output-dir", str(one))
    check(run_script("train.py", *args, "--output-dir", str(two), config="multi_cpu.yaml"))
    a, b = _losses(one), _losses(two)
    assert sorted(a) == list(range(1, 13)) and a == pytest.approx(b, abs=1e-5)
    diff = max_abs_diff(weights(one), weights(two))
    print(f"max weight difference, 1 vs 2 processes: {diff:.3g}")
    assert diff <= 1e-6


def test_sigkill_mid_epoch_then_resume_auto_is_bit_identical(tmp_path, monkeypatch):
    """A real run killed (SIGKILL) in epoch 2, after its step-8 checkpoint (step 2 of 6 in that epoch), resumed
    with --resume auto and 2 DataLoader workers: every weight equal to a straight run's with none."""
    import fault_train  # noqa: F401  (registers hang_lenet: this process resumes the run that hung)

    monkeypatch.delenv("FAULT_CALL", raising=False)
    root = shard_set(tmp_path / "data", "parquet", "folders", size=16, row_group=8)  # 96 rows: 6 steps an epoch
    args = ["--dataset", f"shards:{root}", *SGD, *FAST, "--model", "hang_lenet", "--max-steps", "16",
            "--checkpoint-every", "4", "--no-checkpoint-epochs"]  # fmt: skip
    straight, out = tmp_path / "straight", tmp_path / "run"
    fit_here(*args, "--output-dir", str(straight))
    cmd = launch_cmd("tests/fault_train.py", *args, "--num-workers", "2", "--resume", "auto", "--output-dir", str(out))
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env({"FAULT_CALL": "10"}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip  # hangs in step 10's forward
    try:
        assert wait_for_step(out, 9, proc, timeout=240), proc.communicate(timeout=30)[0][-3000:]
        assert (out / "checkpoints" / "step_00000008").is_dir()
        workers = child_pids(proc.pid)
        assert len(workers) >= 2, workers  # the train and eval loaders' workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _gone(workers)  # orphaned, they leave within 5 s (they watch their parent), with the run lock they inherited
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL and not (out / "summary.json").exists()
    assert max(_losses(out)) >= 9
    fit_here(*args, "--num-workers", "2", "--resume", "auto", "--output-dir", str(out))
    resumed = [m for m in metrics(out) if m["event"] == "resume"]
    assert [m["step"] for m in resumed] == [8] and resumed[0]["epoch"] == 1
    a, b = weights(straight), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"max diff {max_abs_diff(a, b)}"
    assert {s: v for s, v in _losses(out).items() if s > 8} == {s: v for s, v in _losses(straight).items() if s > 8}


def test_undecodable_image_stops_the_run_with_one_line_naming_the_shard(tmp_path):
    """An image whose header reads well but whose pixels do not decode: the run ends with exit 2 and one line naming
    the shard and the row, when it first decodes it (here the sample the export's preprocessing record reads)."""
    import pyarrow.parquet as pq

    root = shard_set(tmp_path / "data", "parquet", "folders", size=16, shards=4, rows=40)
    shard = root / "train" / "part-00002-of-00004.parquet"
    table = pq.read_table(shard).to_pylist()
    images = [r["image"]["bytes"] for r in table]
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(images[17])
    images[17] = undecodable_png(damaged).read_bytes()
    write_parquet(shard, images, [r["label"] for r in table])
    proc = run_here("train.py", "--dataset", f"shards:{root}", *SGD, *FAST, "--max-steps", "20",
                    "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert_one_line_error(proc, f"shard {shard} row 17", "cannot decode the image")
