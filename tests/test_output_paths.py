"""Every output path of eval.py, predict.py, plot_runs.py and convert is checked before the work (issue 24).

Each refusal: exit 2, one line, no traceback, nothing changed on disk (hashes of the whole test folder), and no
evaluation ran first (nothing printed on stdout).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FAST, check, run_here
from datafiles import write_image_folder
from test_bad_inputs import assert_one_line_error
from test_bad_inputs import snapshot as _follow_snapshot


def snapshot(*roots: Path) -> dict[str, tuple]:
    """``test_bad_inputs.snapshot``, with symbolic links recorded as links (the cases include broken ones)."""
    links = {str(p): ("link", os.readlink(p)) for root in roots for p in Path(root).rglob("*") if p.is_symlink()}
    plain = [p for root in roots for p in Path(root).iterdir() if not p.is_symlink()]
    return {**links, **_follow_snapshot(*plain)}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "run"
    check(run_here("train.py", "--output-dir", str(out), "--max-steps", "3", *FAST))
    return out


def _refused(tmp_path: Path, script: str, args: list[str], *needles: str, watch: tuple[Path, ...] = ()) -> str:
    roots = (tmp_path, *watch)
    before = snapshot(*roots)
    proc = run_here(script, *args)
    line = assert_one_line_error(proc, *needles)
    assert proc.stdout == "", f"work was done before the refusal: {proc.stdout[:500]}"
    assert snapshot(*roots) == before
    return line


def _cases(tmp_path: Path, run: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (the --out value, needles), each made real on disk here."""
    (tmp_path / "exists.json").write_text('{"mine": 1}\n')
    (tmp_path / "a_folder.json").mkdir()
    (tmp_path / "plain_file").write_text("x\n")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    return {
        "existing file": (str(tmp_path / "exists.json"), ("already exists", "--overwrite")),
        "a folder": (str(tmp_path / "a_folder.json"), ("is a directory",)),
        "under a file": (str(tmp_path / "plain_file" / "r.json"), ("which is a file",)),
        "wrong extension": (str(tmp_path / "report.txt"), ("must end in .json",)),
        "symlink loop": (str(tmp_path / "loop.json"), ("cannot be resolved",)),
        "dangling link": (str(tmp_path / "dangling.json"), ("broken symbolic link",)),
        "the run's summary": (str(run / "summary.json"), ("inside the run", "summary.json")),
        "the run's weights": (str(run / "model" / "model.safetensors"), ("must end in .json",)),
        "inside the weights": (str(run / "model" / "eval.json"), ("would overwrite this command's input",)),
    }


@pytest.mark.parametrize(
    "case",
    ["existing file", "a folder", "under a file", "wrong extension", "symlink loop", "dangling link",
     "the run's summary", "the run's weights", "inside the weights"],
)  # fmt: skip
def test_eval_out_is_checked_before_evaluating(tmp_path, run, case):
    value, needles = _cases(tmp_path, run)[case]
    _refused(tmp_path, "eval.py", ["--weights", str(run / "model"), "--out", value], "--out", *needles, watch=(run,))


def test_eval_never_overwrites_the_runs_own_files_even_with_overwrite(tmp_path, run):
    for target in (run / "summary.json", run / "model" / "config.json", run / "checkpoints" / "x.json"):
        args = ["--weights", str(run / "model"), "--out", str(target), "--overwrite"]
        _refused(tmp_path, "eval.py", args, "--out", watch=(run,))


def test_eval_confusion_png_is_checked_and_overwrite_replaces(tmp_path, run):
    _refused(tmp_path, "eval.py", ["--weights", str(run / "model"), "--confusion-png", str(tmp_path / "c.jpg")],
             "--confusion-png", "must end in .png", watch=(run,))  # fmt: skip
    png, report = tmp_path / "c.png", tmp_path / "r.json"
    png.write_bytes(b"old")
    _refused(tmp_path, "eval.py", ["--weights", str(run / "model"), "--confusion-png", str(png)], "already exists")
    args = ["--weights", str(run / "model"), "--confusion-png", str(png), "--out", str(report), "--overwrite"]
    check(run_here("eval.py", *args))
    assert png.read_bytes()[:4] == b"\x89PNG" and json.loads(report.read_text())["samples"] > 0
    before = snapshot(run)
    check(run_here("eval.py", "--weights", str(run / "model"), "--out", str(run / "eval.json")))
    assert snapshot(run) != before and (run / "eval.json").is_file(), "a new file beside a run is fine"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="a read-only mount needs root")
def test_eval_out_on_a_read_only_file_system(tmp_path, run):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        _refused(tmp_path, "eval.py", ["--weights", str(run / "model"), "--out", str(ro / "r.json")],
                 "read-only file system")  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(ro)])


def test_predict_sheet_and_plot_runs_out_are_checked_first(tmp_path, run):
    images = write_image_folder(tmp_path / "imgs", classes=("a",), per_class=2, size=8)
    one = sorted(images.rglob("*.png"))[0]
    weights = ["--weights", str(run / "model")]
    _refused(tmp_path, "predict.py", [*weights, str(one), "--sheet", str(one)], "--sheet", "input", watch=(run,))
    _refused(tmp_path, "predict.py", [*weights, str(one), "--sheet", str(tmp_path / "s.pdf")], "must end in .png")
    _refused(tmp_path, "plot_runs.py", [str(run), "--out", str(run / "curves.png")], "--out", watch=(run,))
    (tmp_path / "cmp.png").write_bytes(b"mine")
    _refused(tmp_path, "plot_runs.py", [str(run), "--out", str(tmp_path / "cmp.png")], "already exists")
    check(run_here("plot_runs.py", str(run), "--out", str(tmp_path / "cmp.png"), "--overwrite"))
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"


def test_convert_out_folder_is_checked_first(tmp_path, run):
    (tmp_path / "file").write_text("x")
    src = ["convert_checkpoint.py", str(run / "model")]
    _refused(tmp_path, src[0], [*src[1:], "--out", str(tmp_path / "file")], "is a file, not a folder", watch=(run,))
    _refused(tmp_path, src[0], [*src[1:], "--out", str(tmp_path / "file" / "x")], "which is a file", watch=(run,))
    _refused(tmp_path, src[0], [*src[1:], "--out", str(run / "model")], "--out", watch=(run,))
    _refused(tmp_path, src[0], [*src[1:], "--out", str(run / "best")], "inside the run", watch=(run,))


def test_eval_report_is_valid_json_when_the_weights_are_nan(tmp_path, run, capsys):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan"
    shutil.copytree(run / "model", bad)
    tensors = load_file(str(bad / "model.safetensors"))
    for t in tensors.values():
        if t.is_floating_point():
            t.fill_(math.nan)
    save_file(tensors, str(bad / "model.safetensors"))
    for out in ([], ["--out", str(tmp_path / "r.json")]):
        proc = check(run_here("eval.py", "--weights", str(bad), *out))
        text = (tmp_path / "r.json").read_text() if out else proc.stdout
        report = json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
        assert report["loss"] is None
        assert "not finite" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
