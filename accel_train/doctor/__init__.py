"""Check the machine and accelerate config files before ``accelerate launch``.

``diagnose_config`` asks accelerate itself what ``accelerate launch --config_file F`` would do: its
own parser, ``_validate_launch_command``, choice of launcher and env-preparing functions run up to the
point where processes would start (``plan.py``). What train.py then makes of those processes
(``ranks.py``) and the traps accelerate lets through (``checks.py``) come from ``runtime.py``'s and
``elastic.py``'s own predicates. Measured with accelerate 1.15:

* ``MULTI_CPU`` uses the simple launcher: ONE process unless mpirun is installed and
  ``mpirun_config.mpirun_hostfile`` is set; on one machine train.py then starts the ranks itself.
* ``MULTI_GPU``/``FSDP``/``MEGATRON_LM`` go through torchrun and start ``num_processes``
  processes even without CUDA (``train.py`` then runs gloo DDP on CPU).
* ``use_cpu: true`` only reaches the simple launcher's processes; ``--cpu`` forces that launcher.
* ``gpu_ids`` REPLACES ``CUDA_VISIBLE_DEVICES`` for the launched processes, so its
  indices are physical; inside the processes the chosen GPUs are renumbered from 0.
* Unquoted ``NO``/``no``/``0`` are YAML 1.1 booleans/ints and break the launcher.

``run_smoke`` (``--smoke``) launches 2 real steps and compares what the run recorded with the plan.
"""

from accel_train.doctor.configfile import CUDA_TYPES, MULTI_CONFIG, Diagnosis, Finding
from accel_train.doctor.diagnose import diagnose_config
from accel_train.doctor.environment import Environment, devices_report, parse_visible_devices, port_in_use
from accel_train.doctor.report import (
    RUN_KEYS,
    format_devices,
    format_diagnosis,
    format_json,
    format_report,
    report_dict,
)
from accel_train.doctor.smoke import run_smoke

__all__ = [
    "CUDA_TYPES",
    "MULTI_CONFIG",
    "RUN_KEYS",
    "Diagnosis",
    "Environment",
    "Finding",
    "devices_report",
    "diagnose_config",
    "format_devices",
    "format_diagnosis",
    "format_json",
    "format_report",
    "parse_visible_devices",
    "port_in_use",
    "report_dict",
    "run_smoke",
]
