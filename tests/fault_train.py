"""scripts/train.py with fault-injecting models, for the fault-tolerance tests.

Models registered here (the real loop, the real launcher; only the model misbehaves):
- ``nan_lenet``: LeNet whose output is NaN on the forward calls listed in FAULT_NAN_CALLS ("7,8");
  FAULT_NAN_FROM=N makes every call from N on NaN.
- ``crash_lenet``: raises on rank FAULT_RANK at forward call FAULT_CALL.
- ``hang_lenet``: sleeps forever on rank FAULT_RANK at forward call FAULT_CALL.

FAULT_ENOSPC makes the disk "fill up" (OSError ENOSPC, as a real full disk gives):
``checkpoint:N`` during the N-th checkpoint save (after a partial file is written),
``export`` in every safetensors write (exports; checkpoints too, unless disabled),
``metrics:N`` on the N-th metrics line.

FAULT_STEP_SLEEP_S=S: every training forward of LeNet (the faulty ones too) sleeps S seconds first: a run slow
enough that a test's signal lands mid-run however loaded the machine is, with the same arithmetic.

FAULT_SLOW_EXIT=S: the way out after an error (``cli._unexpected``, where the one-line error is printed) takes S
seconds longer, as a loaded machine's teardown does: a launcher's SIGTERM then lands in it.
"""

import errno
import os
import time
from pathlib import Path

import torch

from accel_train.models import register_model
from accel_train.models.lenet import LeNet


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


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fill_disk_at(spec: str) -> None:
    what, _, nth = spec.partition(":")
    calls = {"n": 0}

    def hit() -> bool:
        calls["n"] += 1
        return calls["n"] == int(nth or 1)

    if what == "checkpoint":
        from accelerate import Accelerator

        real = Accelerator.save_state

        def save_state(self, output_dir=None, **kwargs):
            if hit():
                (Path(output_dir) / "model.safetensors").write_bytes(b"partial")
                _no_space()
            return real(self, output_dir, **kwargs)

        Accelerator.save_state = save_state
    elif what == "export":
        import safetensors.torch

        safetensors.torch.save_file = _no_space
    elif what == "metrics":  # the N-th append really fails: /dev/full answers writes with ENOSPC
        import builtins

        import accel_train.fsio as fsio

        real_open = fsio._open_append
        fsio._open_append = lambda path, what: (
            builtins.open("/dev/full", "a") if str(path).endswith("metrics.jsonl") and hit() else real_open(path, what)
        )


def _slow_exit(seconds: float) -> None:
    import accel_train.cli as cli

    real = cli._unexpected

    def unexpected(exc, debug):
        time.sleep(seconds)
        return real(exc, debug)

    cli._unexpected = unexpected


if os.environ.get("FAULT_SLOW_EXIT"):
    _slow_exit(float(os.environ["FAULT_SLOW_EXIT"]))
if os.environ.get("FAULT_ENOSPC"):
    _fill_disk_at(os.environ["FAULT_ENOSPC"])

if os.environ.get("FAULT_STEP_SLEEP_S"):
    _lenet_forward = LeNet.forward

    def _slow_forward(self, x):
        if self.training:
            time.sleep(float(os.environ["FAULT_STEP_SLEEP_S"]))
        return _lenet_forward(self, x)

    LeNet.forward = _slow_forward

for mode in ("nan", "crash", "hang"):
    cls = type(f"{mode.title()}LeNet", (FaultyLeNet,), {"mode": mode})
    register_model(f"{mode}_lenet", cls)

if __name__ == "__main__":
    from accel_train.commands.train import cli_main

    cli_main()
