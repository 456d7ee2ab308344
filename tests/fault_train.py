"""scripts/train.py with fault-injecting models, for the fault-tolerance tests.

Models registered here (the real loop, the real launcher; only the model misbehaves):
- ``nan_lenet``: LeNet whose output is NaN on the forward calls listed in FAULT_NAN_CALLS ("7,8");
  FAULT_NAN_FROM=N makes every call from N on NaN.
- ``crash_lenet``: raises on rank FAULT_RANK at forward call FAULT_CALL.
- ``hang_lenet``: sleeps forever on rank FAULT_RANK at forward call FAULT_CALL.
"""

import os
import runpy
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from accel_train.models import register_model  # noqa: E402
from accel_train.models.lenet import LeNet  # noqa: E402


def _calls(name: str) -> set[int]:
    return {int(c) for c in os.environ.get(name, "").split(",") if c}


class FaultyLeNet(LeNet):
    mode = "nan"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def forward(self, x):
        out = super().forward(x)
        if not self.training:
            return out
        self.calls += 1
        rank = int(os.environ.get("RANK", "0"))
        at_call = self.calls == int(os.environ.get("FAULT_CALL", "-1"))
        on_rank = rank == int(os.environ.get("FAULT_RANK", "0"))
        if self.mode == "nan":
            nan_from = int(os.environ.get("FAULT_NAN_FROM", "0") or 0)
            if self.calls in _calls("FAULT_NAN_CALLS") or (nan_from and self.calls >= nan_from):
                return out * torch.nan
        elif self.mode == "crash" and at_call and on_rank:
            raise RuntimeError(f"injected failure on rank {rank} at call {self.calls}")
        elif self.mode == "hang" and at_call and on_rank:
            while True:
                time.sleep(1)
        return out


for mode in ("nan", "crash", "hang"):
    cls = type(f"{mode.title()}LeNet", (FaultyLeNet,), {"mode": mode})
    register_model(f"{mode}_lenet", cls)

if __name__ == "__main__":
    sys.argv[0] = str(REPO / "scripts" / "train.py")
    runpy.run_path(str(REPO / "scripts" / "train.py"), run_name="__main__")
