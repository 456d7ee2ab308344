"""Issue 43: --bitwise gives bit-identical weights on 1 process x 4 micro-batches, 2 x 2 and 4 x 1 (Adam), across
a stop on 2 processes and a resume on 1; the normal mode differs (so the comparison proves something)."""

from __future__ import annotations

import pytest
from conftest import FAST, check, fit_here, max_abs_diff, run_here, run_script, summary, weights

# G 32, M 8: 1 x 8 x 4 accumulation, 2 x 8 x 2, 4 x 8 x 1; Adam (the default optimizer)
ARGS = ["--max-steps", "30", "--log-every", "5", *FAST, "--global-batch-size", "32", "--max-device-batch", "8"]
LENET = ["--model", "lenet", *ARGS]


@pytest.fixture(scope="module")
def lenet_one(tmp_path_factory):
    """The straight bitwise run on one process (1 x 8 x 4), in this process."""
    out = tmp_path_factory.mktemp("bitwise") / "one"
    fit_here(*LENET, "--bitwise", "--output-dir", str(out))
    return out


def test_bitwise_lenet_one_vs_two_processes_is_exact_and_normal_mode_is_not(lenet_one, tmp_path):
    two = tmp_path / "two"
    check(run_script("train.py", *LENET, "--bitwise", "--output-dir", str(two), config="multi_cpu.yaml"))
    assert summary(two)["world_size"] == 2 and summary(two)["accum_steps"] == 2
    assert summary(lenet_one)["threads_per_process"] == summary(two)["threads_per_process"] == 1
    assert max_abs_diff(weights(lenet_one), weights(two)) == 0.0
    assert summary(two)["eval_loss"] == summary(lenet_one)["eval_loss"]  # evaluation too
    normal_one, normal_two = tmp_path / "n1", tmp_path / "n2"
    fit_here(*LENET, "--output-dir", str(normal_one))
    check(run_script("train.py", *LENET, "--output-dir", str(normal_two), config="multi_cpu.yaml"))
    assert max_abs_diff(weights(normal_one), weights(normal_two)) > 0.0  # 9e-7 here


def test_bitwise_stop_on_two_processes_resume_on_one_is_exact(lenet_one, tmp_path):
    out = tmp_path / "run"
    args = [*LENET, "--bitwise", "--output-dir", str(out)]
    check(run_script("train.py", *args, "--stop-at-step", "12", config="multi_cpu.yaml"))
    check(run_here("train.py", *args, "--resume", "auto"))
    assert summary(out)["global_step"] == 30 and summary(out)["world_size"] == 1
    assert max_abs_diff(weights(lenet_one), weights(out)) == 0.0


@pytest.mark.slow  # mnist_cnn at 1 thread: ~1 min per process count; 4 gloo ranks on 2 cores
@pytest.mark.parametrize("model", ["lenet", "mnist_cnn"])
def test_bitwise_one_two_and_four_processes(tmp_path, model):
    args = ["--model", model, *ARGS, "--bitwise"]
    fit_here(*args, "--output-dir", str(tmp_path / "one"))
    check(run_script("train.py", *args, "--output-dir", str(tmp_path / "two"), config="multi_cpu.yaml"))
    four = ("--num_processes", "4")
    check(run_script("train.py", *args, "--output-dir", str(tmp_path / "4"), config="multi_cpu.yaml", launch_args=four))
    one = weights(tmp_path / "one")
    assert max_abs_diff(one, weights(tmp_path / "two")) == 0.0
    assert max_abs_diff(one, weights(tmp_path / "4")) == 0.0


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--max-device-batch", "auto"], "needs --global-batch-size G and --max-device-batch M"),
        (["--compile"], "cannot be combined with --compile"),
        (["--mixed-precision", "bf16"], "one thread per process in fp32"),
        (["--model", "resnet18", "--sync-bn", "--image-size", "8"], "cannot train a BatchNorm model"),
        (["--global-batch-size", "20"], "needs the micro-batch --max-device-batch 8 on every setup"),
    ],
)
def test_bitwise_refusals_are_one_line(tmp_path, extra, says):
    proc = run_here("train.py", *LENET, "--bitwise", *extra, "--output-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()
