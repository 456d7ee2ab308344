"""The red-team round on the data layer (reproductions r01..r20), where the promise is about a command: a resume on
data changed in place is refused (exit 2, one line, the run folder untouched), a run and ``eval.py`` with plots on
a class folder whose name is not UTF-8 finish, a FIFO named as an image is refused without a hang.

Like tests/integration/test_data_trust_runs.py: tiny generated data, dated back (``datafiles.age``) so that the
index cache is written and a later launch could be fooled by it; the runs that only prepare a check go through the
script's ``main`` in this process (``run_here``), the checked ones in a new process where the process matters.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from checks import assert_one_line_error, run_folder_snapshot
from conftest import check, run_here, run_script, summary
from datafiles import _colour_images, age, write_hf_disk, write_image_folder
from helpers_shards import move_arrow_labels, png, write_parquet

QUIET = ["--report-to", "none", "--no-progress"]  # plots on: r12 is about them
LENET = ["--model", "lenet", "--batch-size", "4", *QUIET]


def train(dataset: str, out: Path, *args: str, here: bool = False, plots: bool = False, timeout: float = 120):
    """``scripts/train.py --dataset dataset ... --output-dir out`` (lenet, batch 4, no plots unless ``plots``) in a
    new process, or with ``here`` through the script's ``main`` in this process."""
    cmd = ("train.py", "--dataset", dataset, *LENET, *([] if plots else ["--no-plots"]), "--output-dir", str(out))
    return run_here(*cmd, *args) if here else run_script(*cmd, *args, timeout=timeout)


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-5000:]


def _ppm_folder(root: Path, classes=("cat", "dog"), per_class: int = 6) -> Path:
    """Every file the same size (PPM), a class colour each; dated back."""
    from PIL import Image

    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (16, 16), (30 + 200 * c, i * 10, 200 - 150 * c)).save(root / name / f"{i}.ppm")
    age(root)
    return root


def _refused_resume(dataset: str, run: Path, *needles: str, here: bool = True) -> str:
    """``--resume auto`` on changed data: exit 2, one line naming ``needles`` and the way on, nothing written."""
    before = run_folder_snapshot(run)
    refused = train(dataset, run, "--max-steps", "6", "--resume", "auto", here=here)
    line = assert_one_line_error(refused, *needles, "--resume-changed-data")
    assert run_folder_snapshot(run) == before, f"the refusal wrote to the run folder: {line}"
    assert not (run / "model").exists()
    return line


# --------------------------------------------------------------------------- r01, r02: swapped in place


def test_r01_a_resume_after_a_same_size_content_swap_with_times_restored_is_refused(tmp_path):
    data = _ppm_folder(tmp_path / "f")
    run = tmp_path / "run"
    check(train(f"imagefolder:{data}", run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    a, b = data / "cat" / "0.ppm", data / "dog" / "0.ppm"
    sa, sb, da, db = a.stat(), b.stat(), a.read_bytes(), b.read_bytes()
    assert sa.st_size == sb.st_size and da != db
    a.write_bytes(db)
    b.write_bytes(da)
    os.utime(a, ns=(sa.st_atime_ns, sa.st_mtime_ns))
    os.utime(b, ns=(sb.st_atime_ns, sb.st_mtime_ns))
    line = _refused_resume(f"imagefolder:{data}", run, "2 file(s) rewritten or replaced in place", here=False)
    assert "cat/0.ppm" in line and "dog/0.ppm" in line, line


def test_r02_a_resume_after_two_class_folders_were_swapped_is_refused(tmp_path):
    data = _ppm_folder(tmp_path / "f")
    run = tmp_path / "run"
    check(train(f"imagefolder:{data}", run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    os.rename(data / "cat", data / "tmp")
    os.rename(data / "dog", data / "cat")
    os.rename(data / "tmp", data / "dog")
    _refused_resume(f"imagefolder:{data}", run, "rewritten or replaced in place", "cat/0.ppm")


# --------------------------------------------------------------------------- r03, r04: labels rewritten in place


def _plain_parquet(path: Path, labels: list[int]) -> Path:
    """A shard whose size does not depend on its label values (no compression, dictionary or statistics)."""
    import pyarrow.parquet as pq

    images = [png(a) for a in _colour_images(np.asarray(labels), 16, seed=len(labels))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(write_parquet(None, images, labels), path, compression="none", use_dictionary=False,
                   write_statistics=False)  # fmt: skip
    return path


def test_r03_a_resume_after_a_shard_was_rewritten_with_other_labels_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "shards"
    shard = _plain_parquet(data / "train-00000-of-00001.parquet", [i % 3 for i in range(24)])
    _plain_parquet(data / "test-00000-of-00001.parquet", [i % 3 for i in range(9)])
    age(data)
    run = tmp_path / "run"
    check(train(f"shards:{data}", run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    st, table = shard.stat(), pq.read_table(shard)
    moved = pa.array([(v + 1) % 3 for v in table.column("label").to_pylist()], pa.int64())
    table = table.set_column(table.schema.get_field_index("label"), table.schema.field("label"), moved)
    pq.write_table(table, shard, compression="none", use_dictionary=False, write_statistics=False)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size
    _refused_resume(f"shards:{data}", run, "rows with other labels")


def test_r04_a_resume_after_an_hf_arrow_file_was_edited_is_refused(tmp_path):

    data = write_hf_disk(tmp_path / "hfdisk", n=24, splits=True, size=16)
    run = tmp_path / "run"
    check(train(f"hf:{data}", run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    (arrow,) = sorted((data / "train").glob("*.arrow"))
    move_arrow_labels(arrow)  # state.json (the fingerprint) as it was
    _refused_resume(f"hf:{data}", run, "train:", "rows with other labels")


# --------------------------------------------------------------------------- r08: test/ linking to train/


def test_r08_a_test_folder_linking_to_train_is_refused_in_one_line(tmp_path):
    data = tmp_path / "F"
    write_image_folder(data / "train", classes=("cat", "dog"), per_class=4, size=16)
    (data / "test").symlink_to(data / "train", target_is_directory=True)
    proc = train(f"imagefolder:{data}", tmp_path / "run", "--max-steps", "1", here=True)
    assert_one_line_error(proc, "in the training and the test split")
    assert not (tmp_path / "run" / "model").exists()


# --------------------------------------------------------------------------- r12: a class name not UTF-8, plots on


def test_r12_a_class_folder_name_that_is_not_utf8_trains_with_plots_and_eval_draws_the_confusion(tmp_path):
    data = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=16)
    os.rename(data / "dog", os.path.join(os.fsencode(data), b"d\xf6g"))
    age(data)
    run = tmp_path / "run"
    proc = train(f"imagefolder:{data}", run, "--max-steps", "2", plots=True)
    no_traceback(proc)
    check(proc)
    assert summary(run)["global_step"] == 2, "the run died after training (the confusion plot)"
    assert (run / "confusion.png").stat().st_size > 0
    names = json.loads((run / "model" / "config.json").read_bytes().decode("utf-8"))["class_names"]
    assert len(names) == 2 and names[0] == "cat", names
    png_out = tmp_path / "cm.png"
    report = check(run_here("eval.py", "--weights", str(run / "model"), "--confusion-png", str(png_out)))
    no_traceback(report)
    assert png_out.stat().st_size > 0


# --------------------------------------------------------------------------- r20: a FIFO named as an image


def test_r20_a_fifo_named_like_an_image_is_refused_in_one_line_without_a_hang(tmp_path):
    data = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=16)
    os.mkfifo(data / "cat" / "pipe.png")
    proc = train(f"imagefolder:{data}", tmp_path / "run", "--max-steps", "1", timeout=60)  # a hang: TimeoutExpired
    assert_one_line_error(proc, "cat/pipe.png", "not a regular file")
