"""What a user sees and gets from a run: progress output, trackers, curves and plots, predict on its export.

Runs are shared between tests through module-scoped fixtures; each is the real ``scripts/train.py``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, REPO, _env, check, metrics, run_here, run_on, summary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# One torch thread: the same results, and no OpenMP spin-waiting when other jobs share the 2 cores.
SHORT = ["--max-steps", "12", "--log-every", "5", "--threads", "1"]


def _train(out: Path, *args: str, config: str | None = None) -> subprocess.CompletedProcess:
    return run_on(config, "train.py", "--output-dir", str(out), *args)


# --------------------------------------------------------------------------- shared runs


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ux")


@pytest.fixture(scope="module")
def default_run(runs_root) -> tuple[Path, subprocess.CompletedProcess]:
    """A short default training run (3 of the default 8 epochs): lenet on digits, TensorBoard, curves.png,
    export to OUTPUT_DIR/model."""
    out = runs_root / "cpu"
    return out, check(_train(out, "--epochs", "3", "--threads", "1"))


@pytest.fixture(scope="module")
def plain_run(runs_root) -> tuple[Path, subprocess.CompletedProcess]:
    """stdout is a pipe (not a TTY) and progress is on: plain lines. CSV tracker only."""
    out = runs_root / "plain"
    return out, check(_train(out, *SHORT, "--report-to", "csv", "--no-plots"))


@pytest.fixture(scope="module")
def quiet_run(runs_root) -> tuple[Path, subprocess.CompletedProcess]:
    out = runs_root / "quiet"
    return out, check(_train(out, *SHORT, "--no-progress", "--report-to", "none", "--no-plots"))


@pytest.fixture(scope="module")
def multi_cpu_run(runs_root) -> Path:
    """2 gloo DDP ranks on the CPU through ``accelerate launch`` (multi_cpu.yaml)."""
    out = runs_root / "multi_cpu"
    check(_train(out, "--max-steps", "12", "--log-every", "4", *FAST, config="multi_cpu.yaml"))
    return out


# --------------------------------------------------------------------------- progress output


def test_non_tty_progress_is_plain_lines(plain_run):
    out, proc = plain_run
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[train] step 5 ") for line in lines), proc.stdout
    assert any(line.startswith("[train] step 10 ") for line in lines), proc.stdout
    assert not any(line.startswith("[train] step 12 ") for line in lines), "only every --log-every steps"
    assert any(line.startswith("[eval] step 12 ") for line in lines), proc.stdout
    train_line = next(line for line in lines if line.startswith("[train] step 5 "))
    for field in ("loss", "accuracy", "lr", "samples_per_s"):
        assert f"| {field} " in train_line, train_line
    # no tqdm bar anywhere: no carriage returns, no percentage bars
    for stream in (proc.stdout, proc.stderr):
        assert "\r" not in stream
        assert not re.search(r"\d+%\|", stream), stream
    assert summary(out)["global_step"] == 12


def test_no_progress_removes_the_bar_not_the_train_lines(quiet_run):
    """--no-progress turns the bar off; the [train] lines stay (they went too, so nothing showed progress)."""
    out, proc = quiet_run
    assert "[train] step" in proc.stdout, proc.stdout
    assert "\r" not in proc.stdout + proc.stderr
    assert "accel_train: eval_accuracy" in proc.stdout  # the result is still reported
    assert any(m["event"] == "train" for m in metrics(out)), "metrics.jsonl still gets the train records"


class _PtyRun:
    """Run a command with stdout/stderr on a pseudo-terminal and collect what it shows."""

    def __init__(self, cmd: list[str], env: dict[str, str], columns: int = 160):
        import fcntl
        import pty
        import struct
        import termios

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True
        )
        os.close(slave)
        chunks = []
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 1.0)
                if ready:
                    try:
                        data = os.read(master, 65536)
                    except OSError:  # EIO: every slave end closed
                        break
                    if not data:
                        break
                    chunks.append(data)
                elif proc.poll() is not None:
                    break
        finally:
            os.close(master)
            if proc.poll() is None:
                proc.kill()
            self.returncode = proc.wait()
        self.output = b"".join(chunks).decode("utf-8", errors="replace")


def test_tty_shows_a_tqdm_bar(tmp_path):
    try:
        import pty  # noqa: F401

        os.close(os.openpty()[0])
    except (ImportError, OSError) as exc:
        pytest.skip(f"no pseudo-terminal here: {exc}")
    out = tmp_path / "tty"
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), "--output-dir", str(out)]
    cmd += ["--max-steps", "20", "--log-every", "5", "--report-to", "none", "--no-plots", "--threads", "1"]
    run = _PtyRun(cmd, _env({"TERM": "xterm"}))
    text = run.output
    assert run.returncode == 0, text[-4000:]
    assert "\r" in text
    bars = [seg for seg in re.split(r"[\r\n]+", text) if re.match(r"train:\s+\d+%\|", seg)]
    assert bars, text[-4000:]
    final = [b for b in bars if "samples_s=" in b and "loss=" in b and "acc=" in b]
    assert final, bars
    assert "20/20" in bars[-1]
    assert "[train] step" not in text, "a TTY gets the bar, not plain lines"
    assert re.search(r"(^|\n)\[eval\] step 20 ", text), "eval lines are written above the bar"
    # the run header is printed on its own lines, not glued to the end of a bar line
    assert re.search(r"(^|\n)accel_train: lenet on digits", text), text[:1000]
    assert summary(out)["global_step"] == 20


# --------------------------------------------------------------------------- trackers


def test_tensorboard_default_tracker(default_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = default_run
    tb = out / "tb"
    assert list(tb.glob("events.out.tfevents.*")), list(tb.rglob("*"))
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags and "eval/accuracy" in tags and "eval_accuracy" not in tags, tags
    records = metrics(out)
    train_steps = [r["step"] for r in records if r["event"] == "train"]
    eval_steps = [r["step"] for r in records if r["event"] == "eval"]
    assert [e.step for e in acc.Scalars("train/loss")] == train_steps
    assert [e.step for e in acc.Scalars("eval/accuracy")] == eval_steps
    assert train_steps[0] == 10 and all(s % 10 == 0 for s in train_steps)  # default --log-every 10
    assert eval_steps[-1] == summary(out)["global_step"]
    last_eval = next(r for r in reversed(records) if r["event"] == "eval")
    assert acc.Scalars("eval/accuracy")[-1].value == pytest.approx(last_eval["eval_accuracy"], rel=1e-6)
    assert not (out / "metrics.csv").exists()


def test_report_to_csv(plain_run):
    out, _ = plain_run
    with open(out / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    header = list(rows[0])
    assert header[0] == "step" and any("loss" in col for col in header), header
    assert "train/loss" in header and "eval/accuracy" in header, header
    assert [int(r["step"]) for r in rows if r["train/loss"]] == [5, 10]
    assert not (out / "tb").exists()
    assert (out / "metrics.jsonl").is_file()


def test_report_to_none(quiet_run):
    out, _ = quiet_run
    assert not (out / "tb").exists() and not (out / "metrics.csv").exists()
    assert (out / "metrics.jsonl").is_file()


def _write_fake_run(out: Path) -> None:
    out.mkdir(parents=True)
    (out / "config.yaml").write_text("model: someone_elses\n")
    (out / "metrics.jsonl").write_text(json.dumps({"event": "train", "step": 999, "epoch": 0, "loss": 9.9}) + "\n")
    (out / "summary.json").write_text(json.dumps({"global_step": 999}))


def test_existing_run_is_refused_then_overwritten_reporting_to_all(tmp_path):
    out = tmp_path / "taken"
    _write_fake_run(out)
    proc = _train(out, *SHORT, *FAST)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "already holds a run" in errors[0] and "--resume" in errors[0] and "--overwrite" in errors[0]
    assert "999" in (out / "metrics.jsonl").read_text(), "the refused run must not touch the old one"

    proc = check(_train(out, *SHORT, "--overwrite", "--report-to", "all", "--no-plots", "--no-progress"))
    assert summary(out)["global_step"] == 12
    assert all(m.get("step") != 999 for m in metrics(out)), "--overwrite replaces the old run"
    assert "someone_elses" not in (out / "config.yaml").read_text()
    assert list((out / "tb").glob("events.out.tfevents.*")), "--report-to all: TensorBoard"
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "step" in header and "train/loss" in header, "--report-to all: CSV"


# --------------------------------------------------------------------------- plots


def test_curves_png_at_the_end_of_a_run(default_run):
    from PIL import Image

    out, proc = default_run
    png = out / "curves.png"
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 400 and image.height > 200
    # written in the run's final phase, in its order (no time margin: a loaded machine takes seconds for a plot):
    # after this run's confusion.json, before summary.json, which marks the run finished
    mtime = png.stat().st_mtime_ns
    assert (out / "confusion.json").stat().st_mtime_ns <= mtime <= (out / "summary.json").stat().st_mtime_ns


def test_plot_runs_compares_two_real_runs(default_run, multi_cpu_run, tmp_path):
    cpu, _ = default_run
    out_png = tmp_path / "compare.png"
    proc = check(run_here("plot_runs.py", str(cpu), str(multi_cpu_run), "--out", str(out_png)))
    assert out_png.read_bytes()[:8] == PNG_SIGNATURE and out_png.stat().st_size > 10_000
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| run |"), proc.stdout
    by_name = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")] for row in rows[1:]}
    assert set(by_name) == {"cpu", "multi_cpu"}, proc.stdout
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    world = header.index("world size")
    assert by_name["cpu"][world] == "1" and by_name["multi_cpu"][world] == "2"
    assert by_name["multi_cpu"][header.index("global step")] == "12"
    assert f"wrote {out_png}" in proc.stdout


# --------------------------------------------------------------------------- predict


def _clear_digits(labels: tuple[int, ...]) -> dict[int, object]:
    """For each label, the test-split digit closest to its class's mean training image (8x8 uint8)."""
    import numpy as np

    from accel_train.data.digits import load_digits_dataset

    dd = load_digits_dataset()
    train_x = np.asarray(dd["train"]["image"], dtype=np.float32)
    train_y = np.asarray(dd["train"]["label"])
    test_x = np.asarray(dd["test"]["image"], dtype=np.float32)
    test_y = np.asarray(dd["test"]["label"])
    chosen = {}
    for label in labels:
        mean = train_x[train_y == label].mean(axis=0)
        candidates = np.flatnonzero(test_y == label)
        dists = ((test_x[candidates] - mean) ** 2).sum(axis=(1, 2))
        chosen[label] = test_x[candidates[int(dists.argmin())]].astype(np.uint8)
    return chosen


def test_predict_on_exported_model(default_run, tmp_path):
    from PIL import Image

    out, _ = default_run
    paths = {}
    for label, pixels in _clear_digits((0, 3)).items():
        path = tmp_path / f"digit_{label}.png"
        Image.fromarray(pixels, mode="L").resize((28, 28), Image.Resampling.BILINEAR).save(path)
        paths[label] = path
    proc = check(run_here("predict.py", "--weights", str(out / "model"), *map(str, paths.values()), "--top-k", "3"))
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 2, proc.stdout
    for label, path in paths.items():
        line = next(line for line in lines if line.startswith(f"{path}: "))
        tokens = line[len(f"{path}: ") :].split()
        assert len(tokens) == 6, line  # 3 x "class prob"
        classes, probs = tokens[0::2], [float(p) for p in tokens[1::2]]
        assert all(0.0 <= p <= 1.0 for p in probs) and sum(probs) <= 1.0 + 1e-3, line
        assert probs == sorted(probs, reverse=True), line
        assert classes[0] == str(label), f"a clear {label} was classified as {classes[0]}: {line}"
