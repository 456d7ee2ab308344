"""Every output path of eval.py, predict.py, plot_runs.py and convert is checked before the work (issue 24).

Each refusal: exit 2, one line, no traceback, nothing changed on disk (hashes of the test folder and the run), and
no work started first: loading the weights, evaluating, reading a run raise here if they are reached, and nothing
is printed on stdout. Also: the eval report is valid JSON for NaN weights, writes are whole or absent, and
integer (quantized) weights for floating-point tensors are refused.


The in-process tests; whole runs and launches are in ../integration/test_output_paths_runs.py.
"""

from __future__ import annotations

import pytest


def test_integer_buffers_still_load_and_one_int8_tensor_is_named():
    import torch
    from torch import nn

    from accel_train.checkpoint.weights import load_weights
    from accel_train.errors import CheckpointError

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    assert sd["1.num_batches_tracked"].dtype == torch.int64
    load_weights(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), sd)  # an integer buffer is fine
    sd["0.weight"] = sd["0.weight"].to(torch.int8)
    with pytest.raises(CheckpointError, match=r"tensor 0\.weight is int8 but the model holds it as float32"):
        load_weights(model, sd, strict=False)
