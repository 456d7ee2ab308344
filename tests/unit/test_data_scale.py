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
