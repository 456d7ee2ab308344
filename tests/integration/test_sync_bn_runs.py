"""``--sync-bn`` (issue 11, item 7): BatchNorm statistics over the global batch, on CPU/gloo too.

Unit tests of :mod:`accel_train.sync_bn` (one process, then two gloo ranks) and the issue's "Done
when": resnet18 trained as 1 x 16 and as 2 x 8 ends with the same weights and BatchNorm buffers
with ``--sync-bn``, and visibly different ones without.


Whole runs and launches; the in-process tests are in ../unit/test_sync_bn.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST, check, max_abs_diff, run_here, run_script, weights

RESNET18_BN_LAYERS = 20  # stem 1 + 8 blocks x 2 + 3 shortcuts


# SGD, not the default Adam: Adam's first step is lr * sign(grad), and most of resnet18's initial
# gradients are below 1e-8, where float32 noise (summation order, 1 vs 2 threads) flips signs and moves
# weights by 2 x lr even between two single-process runs. --image-size 8 (the digits' own size; the
# default resizes to 28): at 28x28 a few ReLU inputs within ~1e-5 of zero flip between any two float32
# runs and move whole channels' gradients by ~1e-3, with or without --sync-bn. These are also resnet18's
# arguments in test_train_e2e.py's parity promise (PARITY there): this pair is that test for resnet18.
E2E = [
    "--model", "resnet18", "--image-size", "8", "--optimizer", "sgd", "--lr", "5e-5", "--max-steps", "20",
    "--global-batch-size", "32", "--no-checkpoint-epochs", *FAST,
]  # fmt: skip


E2E_STEPS = 20


@pytest.fixture(scope="module")
def e2e_runs(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """Four runs shared by the assertions below: {1, 2} processes x {--sync-bn, plain}."""
    root = tmp_path_factory.mktemp("sync_bn")
    runs = {}
    for name, sync in (("sync", ["--sync-bn"]), ("plain", [])):
        one, two = root / f"one_{name}", root / f"two_{name}"
        runs[f"one_{name}"] = (one, check(run_here("train.py", *E2E, *sync, "--output-dir", str(one))))
        runs[f"two_{name}"] = (
            two,
            check(run_script("train.py", *E2E, *sync, "--output-dir", str(two), config="multi_cpu.yaml")),
        )
    return runs


def _split(w: dict) -> tuple[dict, dict]:
    buffers = {k: v for k, v in w.items() if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    return {k: v for k, v in w.items() if k not in buffers}, buffers


def test_sync_bn_two_processes_train_the_same_weights_and_buffers(e2e_runs):
    one, two = weights(e2e_runs["one_sync"][0]), weights(e2e_runs["two_sync"][0])
    params, buffers = _split(one)
    assert len(buffers) == 3 * RESNET18_BN_LAYERS  # the export carries the BatchNorm buffers
    assert all(int(v) == E2E_STEPS for k, v in one.items() if k.endswith("num_batches_tracked"))
    assert max_abs_diff(one, two) <= 1e-5  # the parity promise's tolerance
    assert max_abs_diff(*(_split(w)[1] for w in (one, two))) <= 1e-4
    assert f"sync-bn: converted {RESNET18_BN_LAYERS} BatchNorm layers" in e2e_runs["two_sync"][1].stdout
    assert "one process normalises the whole batch already" in e2e_runs["one_sync"][1].stdout
    for run in ("one_sync", "two_sync"):
        assert "sync_bn: true" in (e2e_runs[run][0] / "config.yaml").read_text().splitlines()


def test_without_sync_bn_the_setups_differ(e2e_runs):
    synced = max_abs_diff(weights(e2e_runs["one_sync"][0]), weights(e2e_runs["two_sync"][0]))
    one, two = weights(e2e_runs["one_plain"][0]), weights(e2e_runs["two_plain"][0])
    plain = max_abs_diff(one, two)
    assert plain > max(1e-3, 10 * synced), (plain, synced)
    assert max_abs_diff(_split(one)[1], _split(two)[1]) > 1e-3  # per-rank running statistics
    assert "sync-bn" not in e2e_runs["two_plain"][1].stdout
    # a plain single-process run is the --sync-bn single-process run: nothing is converted there
    assert max_abs_diff(one, weights(e2e_runs["one_sync"][0])) <= 1e-6
