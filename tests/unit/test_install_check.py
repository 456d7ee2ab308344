"""accel_train/install_check.py: the line a torch/torchvision pair that does not fit gets names a pair that works
(the one constraints.txt records) and a command that needs no other index than PyPI's."""

from __future__ import annotations

import re
from pathlib import Path

from accel_train import install_check

REPO = Path(__file__).resolve().parents[2]


def test_the_pair_named_is_the_one_constraints_txt_records():
    text = (REPO / "constraints.txt").read_text()
    found = re.search(r"The suite last ran with torch (\S+) and torchvision (\S+?)\.?\s*$", text, re.M)
    assert found, "constraints.txt no longer says which torch/torchvision the suite ran with"
    assert install_check.TESTED_PAIR == found.groups()


def test_the_way_out_does_not_depend_on_the_unreachable_index():
    torch_v, vision_v = install_check.TESTED_PAIR
    first = install_check.RECOVER.split(";")[0]
    assert f"torch=={torch_v} torchvision=={vision_v}" in first and "--index-url" not in first, first
    assert install_check.matching_torchvision(torch_v) == ".".join(vision_v.split(".")[:2])


def test_torchvision_for_a_torch():
    assert install_check.matching_torchvision("2.13.0+cpu") == "0.28"
    assert install_check.matching_torchvision("2.4.1") == "0.19"
    assert install_check.matching_torchvision("3.0.0") is None and install_check.matching_torchvision("x") is None


def test_the_readme_names_the_same_pair_for_an_unreachable_index():
    torch_v, vision_v = install_check.TESTED_PAIR
    assert f"python3 -m pip install torch=={torch_v} torchvision=={vision_v}" in (REPO / "README.md").read_text()
