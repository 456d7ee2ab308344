"""benchmarks/data/scale.py's parts on a tiny generated folder: the folder generator, the indexing-memory probe,
the pipeline's images/s beside torchvision's, and the report (the benchmark itself runs minutes, by hand)."""

from __future__ import annotations

from accel_train.data import DataConfig, build_dataset
from benchmarks.data import scale as data_scale
from benchmarks.data.folders import generate


def test_generated_folder_trains_and_the_benchmark_reports_it(tmp_path):
    root = tmp_path / "f"
    generate(root, train=40, test=10, size=8, classes=4, workers=1)
    again = sorted(p.read_bytes() for p in root.rglob("*.png"))
    generate(root, train=40, test=10, size=8, classes=4, workers=1)  # the same files, kept
    assert sorted(p.read_bytes() for p in root.rglob("*.png")) == again and len(again) == 50
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}"))
    assert (len(splits.train), len(splits.test), splits.info.num_classes, splits.info.image_size) == (40, 10, 4, 8)

    memory = data_scale.memory_probe(root, "ours")
    assert memory["files"] == 50 and memory["bytes_per_file"] >= 0
    rate = data_scale.pipeline_rate(root, workers=0, batches=2, repeats=1, batch=8)
    assert set(rate["median_images_per_s"]) == {"ours", "torchvision"} and rate["ratio"] > 0

    rows = {"first_launch": {"first_step_s": 3.0, "peak_rss_mb": 900.0}, "rival": {"first_step_s": 2.0},
            "second_launch": {"first_step_s": 1.0, "peak_rss_mb": 910.0}, "small": {"peak_rss_mb": 905.0}}  # fmt: skip
    derived = data_scale._derived(rows)
    assert derived["first_launch / rival"] == 1.5 and derived["second_launch / rival"] == 0.5
    report = data_scale._report({"folder": {"files": 50, "root": str(root)}, "cpu": {}, "launches": rows,
                                 "derived": derived, "pipeline": rate})  # fmt: skip
    assert "| first_launch | 3.0 |" in report and "ratio" in report


def test_the_own_folder_benchmarks_split_their_flags_and_write_their_folders(tmp_path):
    """``python -m benchmarks shapes`` and ``photos`` (benchmarks/data/own_folder.py): FLAGS after ``--`` go to every
    run; the shapes table's last row is min / median; the folders they generate are the same for the same seed."""
    from benchmarks.data.folders import write_photo_folder, write_shapes_folder
    from benchmarks.data.own_folder import _split, table

    assert _split(["--seeds", "0", "--", "--model", "lenet"]) == (["--seeds", "0"], ["--model", "lenet"])
    assert _split(["--out", "x"]) == (["--out", "x"], [])
    rows = [{"seed": s, "eval_accuracy": a, "global_step": 501, "warning": None, "wall_s": w, "cpu_s": 20.0,
             "load_avg": 1.0} for s, a, w in ((0, 0.9, 30.0), (1, 1.0, 40.0), (2, 0.8, 35.0))]  # fmt: skip
    assert table(rows).splitlines()[-1] == "| min / median | 0.800 / 0.900 | | | 30.0 / 35.0 | | |"
    for name in ("a", "b"):
        write_shapes_folder(tmp_path / name, classes=2, per_class=2, test_per_class=1, size=16, seed=3)
    files = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*.*"))
    assert files == [
        "test/circle/circle_0000.png",
        "test/square/square_0000.png",
        "train/circle/circle_0000.png",
        "train/circle/circle_0001.jpg",
        "train/square/square_0000.png",
        "train/square/square_0001.jpg",
    ]
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    photos = write_photo_folder(tmp_path / "photos", train=3, val=2)
    assert sorted(p.parent.relative_to(photos).as_posix() for p in photos.rglob("*.jpg")) == [
        "train/ants", "train/ants", "train/bees", "val/ants", "val/bees"]  # fmt: skip
