"""Check the machine and accelerate config files before ``accelerate launch``.

``diagnose_config`` predicts what ``accelerate launch --config_file F`` would do
(which launcher, how many processes, which device and backend) and lists the
traps it would fall into. Behaviour modelled on accelerate 1.15
(``commands/launch.py``, ``utils/launch.py``, ``commands/config/config_args.py``)
and checked there by launching a script that prints its ``RANK``:

* ``MULTI_CPU`` uses the simple launcher: ONE process unless mpirun is installed
  and ``mpirun_config.mpirun_hostfile`` is set.
* ``MULTI_GPU``/``FSDP``/``MEGATRON_LM`` go through torchrun and start
  ``num_processes`` processes even without CUDA (``train.py`` then runs gloo DDP on CPU).
* ``use_cpu: true`` in the config only matters to the simple launcher; the
  torchrun path ignores it. ``accelerate launch --cpu`` forces the simple launcher.
* ``gpu_ids`` REPLACES ``CUDA_VISIBLE_DEVICES`` for the launched processes, so its
  indices are physical; inside the processes the chosen GPUs are renumbered from 0.
* ``MULTI_GPU`` on one machine refuses a ``gpu_ids`` with fewer than two entries
  (other than ``all``): ``gpu_ids: '-1'`` raises, ``'-1,-1'`` hides every GPU and passes.
* Unquoted ``NO``/``no``/``0`` are YAML 1.1 booleans/ints and break the launcher.
"""

from accel_train.doctor.configfile import CUDA_TYPES, MULTI_CONFIG, Diagnosis, Finding
from accel_train.doctor.diagnose import diagnose_config
from accel_train.doctor.environment import Environment, devices_report, parse_visible_devices, port_in_use
from accel_train.doctor.report import format_devices, format_diagnosis, format_json, format_report, report_dict

__all__ = [
    "CUDA_TYPES",
    "MULTI_CONFIG",
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
]
