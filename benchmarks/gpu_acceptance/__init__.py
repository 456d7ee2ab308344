"""The GPU acceptance: ``python scripts/gpu_acceptance.py`` runs accel_train's GPU checks on a GPU machine and writes
down what happened (``--plan --json``: the device plan, no GPU needed; docs/gpu/README.md has it and how to run it).

* ``command``: the command line, and the machine it runs on (packages, CUDA GPUs, versions).
* The checks: each (what it runs, its timeout, what it must show to pass and the ``measure``/``judge`` pair that
  decides it) is read in one place, in the module of its kind: ``environment`` (setup, pytest), ``resume``
  (bf16-resume, resume, fsdp, compile), ``parallel`` (ddp, sync-bn, dp, dp_ddp) and ``speed`` (throughput-bf16,
  throughput, speedrun, device-batch). ``runs`` builds their children and reads what the children left.
* ``runner``: children streamed to logs, the timeouts and budget, a report rewritten before and after every
  check; a check that did not finish is "not run", never "pass" and never "fail".
* ``plan``: every check in plan order, grouped into device commands sized to a session's device time; ``sizing``:
  how long each check should take on an H100 (every timeout is at least 1.3x that).
* ``probe`` and ``models``: what the checks run on the device besides ``scripts/train.py``, and the models they
  train (``--model benchmarks.gpu_acceptance.models:bn_net``).

A judge takes the measurements alone and returns ``(status, one-line detail)``, so a test without a GPU can hand it a
deliberately wrong result and see it fail (tests/unit/test_gpu_acceptance.py).
"""
