"""Issue 14, items 1 and 2: any torchvision model, your own model code, and the Python API ``accel_train.train``.

The in-process tests; whole runs (the Python API trains one) and launches are in ../integration/test_own_model_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from accel_train.errors import UserError
from accel_train.models import check_model_name, create_model, min_image_size


def test_torchvision_names_sizes_and_channels():
    check_model_name("tv:resnet50")  # known
    with pytest.raises(UserError, match=r"unknown torchvision model tv:resnet5 \(did you mean tv:resnet50"):
        check_model_name("tv:resnet5")
    with pytest.raises(UserError, match=r"needs images of at least 63x63, got 28x28; resize them with --image-size 63"):
        create_model("tv:alexnet", 10, 1, 28)
    with pytest.raises(UserError, match=r"cannot take 40x40 images .*--image-size 48"):
        create_model("tv:vit_b_16", 10, 3, 40)  # ViT takes multiples of its patch only
    assert min_image_size("tv:alexnet") == 63 and min_image_size("tv:inception_v3") == 75
    model = create_model("tv:vit_b_16", 7, 1, 32)  # the image size reaches the constructor
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 7)
    model = create_model("tv:googlenet", 5, 4, 32).train()  # no auxiliary heads: training mode gives logits
    assert isinstance(model(torch.zeros(2, 4, 32, 32)), torch.Tensor)


def test_too_small_images_for_a_torchvision_model_are_refused_before_loading(tmp_path):
    from accel_train.config import parse_config

    with pytest.raises(UserError, match=r"--synthetic-image-size 16 is too small for --model tv:alexnet.*63x63"):
        parse_config(["--model", "tv:alexnet", "--dataset", "synthetic", "--synthetic-image-size", "16"])


def test_user_model_errors_say_what_to_do(tmp_path):
    with pytest.raises(UserError, match=r"unknown model 'mymodel'.*package\.module:callable"):
        check_model_name("mymodel")
    check_model_name("no_such_package.models:build")  # spelling only: nothing is imported
    with pytest.raises(UserError, match=r"cannot import no_such_package\.models .*PYTHONPATH"):
        create_model("no_such_package.models:build")
    with pytest.raises(UserError, match=r"torch\.nn has no 'Nope'"):
        create_model("torch.nn:Nope")
