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

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import json
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accel_train.errors import UserError

# ---------------------------------------------------------------------------
# environment


def port_in_use(port: int) -> bool:
    """Same check as ``accelerate.utils.is_port_in_use``: can we connect to localhost:port?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("localhost", int(port))) == 0


VERSION_PACKAGES = ("torch", "accelerate", "datasets", "evaluate", "torchvision")


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in VERSION_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _default_config_path() -> str | None:
    """accelerate's default config (``accelerate config`` writes it; ``launch`` reads it), if it exists."""
    try:
        from accelerate.commands.config.config_args import default_config_file
    except ImportError:  # accelerate missing: the versions line says so
        return None
    return default_config_file if os.path.isfile(default_config_file) else None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


@dataclass
class Environment:
    """What the doctor knows about this machine. Tests build it by hand."""

    cuda_device_count: int = 0  # GPUs this process sees (after CUDA_VISIBLE_DEVICES)
    cuda_device_names: list[str] = field(default_factory=list)
    cpu_count: int = 1
    cuda_visible_devices: str | None = None
    mpirun_available: bool = False
    versions: dict[str, str | None] = field(default_factory=dict)
    default_config_path: str | None = None
    port_in_use: Callable[[int], bool] = port_in_use
    # GPUs on the machine regardless of CUDA_VISIBLE_DEVICES (gpu_ids index these);
    # None = unknown (only knowable via NVML when CUDA_VISIBLE_DEVICES is set).
    physical_gpu_count: int | None = None

    @property
    def physical_gpus(self) -> int | None:
        if self.physical_gpu_count is not None:
            return self.physical_gpu_count
        if self.cuda_visible_devices is None:
            return self.cuda_device_count
        return None

    @classmethod
    def detect(cls) -> Environment:
        import torch  # needed for the device count; accelerate imports it anyway

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = []
        for i in range(count):
            try:
                names.append(torch.cuda.get_device_name(i))
            except Exception:  # noqa: BLE001 - a name is only decoration
                names.append("?")
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        physical: int | None = count if cvd is None else None
        if cvd is not None:
            try:
                raw = torch.cuda._raw_device_count_nvml()  # private; ignores CUDA_VISIBLE_DEVICES
                physical = raw if raw >= 0 else None
            except Exception:  # noqa: BLE001 - no NVML here
                physical = None
        default_config = _default_config_path()
        return cls(
            cuda_device_count=count,
            cuda_device_names=names,
            cpu_count=_cpu_count(),
            cuda_visible_devices=cvd,
            mpirun_available=shutil.which("mpirun") is not None or shutil.which("mpiexec") is not None,
            versions=_versions(),
            default_config_path=default_config,
            port_in_use=port_in_use,
            physical_gpu_count=physical,
        )


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """Parse a CUDA_VISIBLE_DEVICES string the way torch/CUDA do.

    None = unset (all devices). A negative or unparsable entry ends the list
    ('-1' and '' hide everything); a repeated entry hides everything.
    """
    if value is None:
        return None
    value = str(value)
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            uuids: list[str] = []
            for elem in value.split(","):
                if elem in uuids:
                    return []
                if not elem.startswith(prefix):
                    break
                uuids.append(elem)
            return uuids
    ids: list[int] = []
    for elem in value.split(","):
        elem = elem.strip()
        digits = ""
        for i, c in enumerate(elem):
            if c.isdigit() or (i == 0 and c in "+-"):
                digits += c
            else:
                break
        try:
            x = int(digits)
        except ValueError:
            x = -1
        if x in ids:
            return []
        if x < 0:
            break
        ids.append(x)
    return ids


def devices_report(env: Environment) -> dict[str, Any]:
    """What ``try_gpu(i)``/``try_all_gpus()`` of the seeds would see, and where those GPUs are."""
    n = env.cuda_device_count
    logical = [f"cuda:{i}" for i in range(n)]
    parsed = parse_visible_devices(env.cuda_visible_devices)
    if parsed is None:
        physical: list[Any] = list(range(n))
    else:
        physical = list(parsed[:n])
        while len(physical) < n:  # should not happen; keep the table total
            physical.append("?")
    mapping = {f"cuda:{i}": physical[i] for i in range(n)}
    if env.cuda_visible_devices is None:
        cvd_note = "unset: cuda:i is physical GPU i"
    elif parsed == []:
        cvd_note = f"{env.cuda_visible_devices!r}: hides every GPU"
    else:
        cvd_note = f"{env.cuda_visible_devices!r}: visible GPUs are renumbered from 0"
    return {
        "cuda_device_count": n,
        "cuda_device_names": list(env.cuda_device_names),
        "try_gpu": logical[0] if logical else "cpu",
        "try_all_gpus": logical or ["cpu"],
        "cuda_visible_devices": env.cuda_visible_devices,
        "cuda_visible_devices_note": cvd_note,
        "logical_to_physical": mapping,
        "physical_gpu_count": env.physical_gpus,
        "cpu_count": env.cpu_count,
        "mpirun_available": env.mpirun_available,
        "versions": dict(env.versions),
        "default_config_path": env.default_config_path,
    }


# ---------------------------------------------------------------------------
# findings


@dataclass
class Finding:
    level: str  # "error" | "warning" | "info"
    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass
class Diagnosis:
    path: str
    plan: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, level: str | None = None) -> list[str]:
        return [f.code for f in self.findings if level is None or f.level == level]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "plan": self.plan,
            "findings": [f.to_dict() for f in self.findings],
        }

    def add(self, level: str, code: str, message: str) -> None:
        self.findings.append(Finding(level, code, message))


MULTI_CONFIG = "accelerate_configs/multi_cpu.yaml"

# distributed types accelerate launches with ``--multi_gpu`` (torchrun)
MULTI_DEVICE_TYPES = {
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_HPU",
    "MULTI_NEURON",
}
TORCHRUN_TYPES = MULTI_DEVICE_TYPES | {"FSDP", "MEGATRON_LM"}
CUDA_TYPES = {"MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM"}
MIXED_PRECISION_VALUES = ("no", "fp16", "bf16", "fp8")

# keys accelerate reads as strings: a plain YAML 1.1 scalar resolving to bool/int/float breaks them
STRING_KEYS = {
    "compute_environment",
    "distributed_type",
    "mixed_precision",
    "gpu_ids",
    "dynamo_backend",
    "dynamo_mode",
    "rdzv_backend",
    "main_process_ip",
    "main_training_function",
    "tpu_name",
    "tpu_zone",
    "command_file",
    "ec2_instance_type",
    "iam_role_name",
    "image_uri",
    "profile",
    "region",
    "base_job_name",
    "pytorch_version",
    "transformers_version",
    "py_version",
    "fsdp_sharding_strategy",
    "fsdp_state_dict_type",
    "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch",
    "fsdp_backward_prefetch_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "deepspeed_multinode_launcher",
    "offload_optimizer_device",
    "offload_param_device",
    "mpirun_hostfile",
}
# string-typed by convention ('no' as written by `accelerate config`) but read as a bool:
# the unquoted form means the same thing, so only a warning.
BOOL_BY_CONVENTION_KEYS = {"downcast_bf16"}
# keys that must not be empty
REQUIRED_KEYS = {"distributed_type"}
# keys ``process_config`` accepts and converts (older config format)
LEGACY_KEYS = {"fp16", "dynamo_backend"}
STR_TAG = "tag:yaml.org,2002:str"
NULL_TAG = "tag:yaml.org,2002:null"


def _known_keys(sagemaker: bool) -> set[str]:
    try:
        from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig

        cls = SageMakerConfig if sagemaker else ClusterConfig
        return set(cls.__dataclass_fields__) | LEGACY_KEYS
    except Exception:  # noqa: BLE001 - accelerate missing: the loader finding says so
        return set()


def _yaml_scan(text: str, diag: Diagnosis) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
    """Compose the YAML (no construction) and flag plain scalars that YAML 1.1 does not keep as strings."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        diag.add("error", "yaml-parse-error", f"not valid YAML: {' '.join(str(e).split())}")
        return None
    if root is None:
        diag.add("error", "not-a-mapping", "the file is empty; an accelerate config is a mapping of keys")
        return None
    if not isinstance(root, yaml.MappingNode):
        diag.add("error", "not-a-mapping", "an accelerate config must be a mapping of keys (key: value lines)")
        return None
    top: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in root.value:
        key = str(key_node.value)
        if key in top:
            diag.add(
                "warning",
                "duplicate-key",
                f"line {key_node.start_mark.line + 1}: {key!r} is set twice; the last one wins",
            )
        top[key] = (key_node, value_node)
    _scan_mapping(root, diag)
    return top


def _scan_mapping(node: yaml.MappingNode, diag: Diagnosis) -> None:
    for key_node, value_node in node.value:
        key = str(key_node.value)
        if isinstance(value_node, yaml.MappingNode):
            _scan_mapping(value_node, diag)
            continue
        if not isinstance(value_node, yaml.ScalarNode) or value_node.style is not None:
            continue  # quoted, block or sequence: fine
        line = value_node.start_mark.line + 1
        if value_node.tag == NULL_TAG:
            if key in REQUIRED_KEYS:
                diag.add("error", "empty-value", f"line {line}: {key} has no value; e.g. {key}: 'NO'")
            continue
        if value_node.tag == STR_TAG:
            continue
        if key not in STRING_KEYS and key not in BOOL_BY_CONVENTION_KEYS:
            continue
        raw = value_node.value
        kind = value_node.tag.rsplit(":", 1)[-1]
        try:
            constructed = yaml.safe_load(f"x: {raw}")["x"]
        except yaml.YAMLError:
            constructed = raw
        if key in BOOL_BY_CONVENTION_KEYS:
            if raw in ("true", "false"):
                continue  # a real boolean, as `accelerate config default` / write_basic_config write it
            diag.add(
                "warning",
                "unquoted-yaml-scalar",
                f"line {line}: {key}: {raw} is read by YAML 1.1 as the {kind} {constructed!r}, not the string "
                f"{raw!r} accelerate writes; harmless here (accelerate reads it as a flag, on TPUs only) but "
                f"quote it to match: {key}: '{raw}'",
            )
            continue
        diag.add(
            "error",
            "unquoted-yaml-scalar",
            f"line {line}: {key}: {raw} is read by YAML 1.1 as the {kind} {constructed!r}, not the string "
            f"{raw!r} accelerate expects: the launch fails or the setting is silently lost; quote it: {key}: '{raw}'",
        )


def _as_int(value: Any, default: int) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def diagnose_config(path: str | Path, env: Environment, *, cpu: bool = False) -> Diagnosis:
    """Predict what ``accelerate launch --config_file path [--cpu]`` does on ``env`` and list its traps.

    Raises ``UserError`` when the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"accelerate config file not found: {path}")
    diag = Diagnosis(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read accelerate config file {path}: {e}") from e

    is_json = path.suffix == ".json"
    top: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    if is_json:
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            diag.add("error", "json-parse-error", f"not valid JSON: {e}")
            return diag
        if not isinstance(cfg, dict):
            diag.add("error", "not-a-mapping", "an accelerate config must be a JSON object")
            return diag
    else:
        scanned = _yaml_scan(text, diag)
        if scanned is None:
            return diag
        top = scanned
        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError as e:
            diag.add("error", "yaml-parse-error", f"not valid YAML: {' '.join(str(e).split())}")
            return diag

    sagemaker = cfg.get("compute_environment") == "AMAZON_SAGEMAKER"

    # unknown keys
    known = _known_keys(sagemaker)
    unknown = [k for k in cfg if known and str(k) not in known]
    for key in unknown:
        line = f"line {top[str(key)][0].start_mark.line + 1}: " if str(key) in top else ""
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else "; remove it"
        kind = "SageMakerConfig" if sagemaker else "ClusterConfig"
        diag.add(
            "error",
            "unknown-key",
            f"{line}{key!r} is not an accelerate {kind} key (accelerate refuses the file){hint}",
        )

    # accelerate's own loader
    try:
        from accelerate.commands.config.config_args import load_config_from_file

        load_config_from_file(str(path))
    except Exception as e:  # noqa: BLE001 - reported as a finding, not a traceback
        message = " ".join(str(e).split())
        if not (unknown and "unknown keys" in message):
            diag.add("error", "config-load-failed", f"accelerate cannot load it: {type(e).__name__}: {message}")

    _plan_and_traps(cfg, env, diag, cpu=cpu)
    return diag


def _plan_and_traps(cfg: dict[str, Any], env: Environment, diag: Diagnosis, *, cpu: bool) -> None:
    add = diag.add
    raw_dt = cfg.get("distributed_type")
    if raw_dt is None:
        if "distributed_type" not in cfg:
            add("error", "distributed-type-missing", "the config has no distributed_type; e.g. distributed_type: 'NO'")
        return
    if not isinstance(raw_dt, str):
        if not any(f.code == "unquoted-yaml-scalar" and "distributed_type" in f.message for f in diag.findings):
            add("error", "invalid-value", f"distributed_type {raw_dt!r} is not a string such as 'NO' or 'MULTI_GPU'")
        return  # accelerate cannot pick a launcher from it
    dt = raw_dt
    if cfg.get("compute_environment") == "AMAZON_SAGEMAKER":
        diag.plan = {"launcher": "sagemaker", "distributed_type": dt, "num_machines": cfg.get("num_machines", 1)}
        add("info", "sagemaker-not-checked", "AMAZON_SAGEMAKER configs run remotely; only the file itself was checked")
        return
    use_cpu = cfg.get("use_cpu") is True

    num_machines = _as_int(cfg.get("num_machines"), 1)
    machine_rank = _as_int(cfg.get("machine_rank"), 0)
    num_processes = _as_int(cfg.get("num_processes"), 1 if dt == "NO" else -1)
    for key, value in (
        ("num_machines", num_machines),
        ("machine_rank", machine_rank),
        ("num_processes", num_processes),
    ):
        if value is None:
            add("error", "invalid-value", f"{key}: {cfg.get(key)!r} is not an integer")
    if num_machines is None or machine_rank is None or num_processes is None:
        return
    if num_processes == -1:
        add(
            "error",
            "num-processes-missing",
            f"distributed_type {dt} without num_processes: accelerate launch stops with "
            "'You need to manually pass in --num_processes'; add num_processes: N",
        )
        return
    if num_processes < 1 or num_machines < 1:
        add("error", "invalid-value", "num_processes and num_machines must be at least 1")
        return

    raw_gpu_ids = cfg.get("gpu_ids")
    gpu_ids = "all" if raw_gpu_ids is None else str(raw_gpu_ids)
    gpu_ids_list = None if gpu_ids == "all" else parse_visible_devices(gpu_ids)
    hidden_by_gpu_ids = gpu_ids_list == []
    env_ids = parse_visible_devices(env.cuda_visible_devices)
    hidden_by_env = env_ids == [] and gpu_ids == "all"

    raw_mp = cfg.get("mixed_precision")
    mp = "no" if raw_mp is None else raw_mp
    if isinstance(mp, str) and mp.lower() not in MIXED_PRECISION_VALUES:
        add("error", "invalid-value", f"mixed_precision: {mp!r} is not one of {', '.join(MIXED_PRECISION_VALUES)}")
    mp = mp.lower() if isinstance(mp, str) else mp

    mpirun_config = cfg.get("mpirun_config")
    hostfile = mpirun_config.get("mpirun_hostfile") if isinstance(mpirun_config, dict) else None

    # --- launcher (mirrors accelerate.commands.launch.launch_command)
    if cpu:
        launcher = "mpirun" if hostfile else "simple"
    elif dt == "DEEPSPEED":
        launcher = "deepspeed"
    elif dt in TORCHRUN_TYPES:
        launcher = "torchrun"
    elif dt == "XLA":
        launcher = "xla"
    else:
        launcher = "mpirun" if hostfile else "simple"

    # --- processes
    if launcher in ("torchrun", "deepspeed", "mpirun"):
        per_machine = num_processes // num_machines if num_machines > 1 else num_processes
        world_size = per_machine * num_machines if launcher != "mpirun" else num_processes
    else:
        per_machine = 1
        world_size = 1

    # --- GPUs the launched processes see (gpu_ids replaces CUDA_VISIBLE_DEVICES)
    physical = env.physical_gpus
    if gpu_ids_list is None:
        n_gpus = env.cuda_device_count
    elif physical is None:
        n_gpus = len(gpu_ids_list)
    else:
        n_gpus = 0
        for gid in gpu_ids_list:
            if not isinstance(gid, int) or gid >= physical:
                break
            n_gpus += 1
    cpu_forced = cpu or (launcher in ("simple", "mpirun") and use_cpu)
    if launcher == "xla":
        device = "xla"
    elif cpu_forced or n_gpus == 0:
        device = "cpu"
    else:
        device = "cuda"
    if world_size > 1:
        backend = "nccl" if device == "cuda" else "gloo" if device == "cpu" else None
    else:
        backend = None

    if mp == "fp16" and device == "cpu":
        effective_mp = "no (fp16 ignored on CPU)"
    elif isinstance(mp, str):
        effective_mp = mp
    else:
        effective_mp = f"{mp!r} (invalid)"

    data_parallel = dt == "NO" and launcher == "simple" and device == "cuda" and n_gpus > 1
    why_cpu = ""
    if device == "cpu":
        if cpu:
            why_cpu = " (accelerate launch --cpu)"
        elif hidden_by_gpu_ids:
            why_cpu = f" (GPUs hidden by gpu_ids {gpu_ids!r})"
        elif hidden_by_env:
            why_cpu = f" (GPUs hidden by CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r})"
        elif use_cpu and cpu_forced:
            why_cpu = " (use_cpu: true)"
        elif dt in CUDA_TYPES and launcher in ("torchrun", "deepspeed"):
            why_cpu = " (no CUDA device: train.py's fallback)"
    procs = _plural(world_size, "process")
    if num_machines > 1 and launcher != "simple":
        procs += f" ({per_machine} per machine x {num_machines} machines; this is machine rank {machine_rank})"
    if world_size > 1 or (num_machines > 1 and launcher != "simple"):
        if device == "cuda":
            where = f"on {_plural(n_gpus, 'GPU')}" + (" per machine" if num_machines > 1 else "")
        else:
            where = "on CPU" if device == "cpu" else f"on {device}"
        summary = f"{procs}, {backend or dt} DDP {where}{why_cpu}"
    elif data_parallel:
        summary = f"1 process, nn.DataParallel over {n_gpus} GPUs"
    elif device == "cuda":
        summary = f"1 process on cuda:0 (of {_plural(n_gpus, 'visible GPU')})"
    else:
        summary = f"1 process on {device}{why_cpu}"

    diag.plan = {
        "summary": summary,
        "launcher": launcher,
        "processes_per_machine": per_machine,
        "num_machines": num_machines,
        "machine_rank": machine_rank,
        "world_size": world_size,
        "backend": backend,
        "device": device,
        "visible_gpus": n_gpus if device == "cuda" else 0,
        "gpu_ids": gpu_ids,
        "mixed_precision": effective_mp,
        "distributed_type": dt,
        "data_parallel": data_parallel,
    }

    # --- traps
    if launcher == "simple" and num_processes > 1:
        if dt == "MULTI_CPU" and not cpu:
            reason = (
                "mpirun is not installed" if not env.mpirun_available else "no mpirun_config.mpirun_hostfile is set"
            )
            add(
                "error",
                "multi-cpu-one-process",
                f"distributed_type MULTI_CPU with num_processes {num_processes}: accelerate uses its simple launcher "
                f"because {reason}, so only ONE process would start (train.py refuses to run). For gloo DDP on CPU "
                f"use {MULTI_CONFIG} (torchrun with GPUs hidden), or set num_processes: 1",
            )
        elif cpu:
            add(
                "error",
                "cpu-flag-one-process",
                f"accelerate launch --cpu always uses the simple launcher: ONE process, not {num_processes}. "
                f"For gloo DDP on CPU use {MULTI_CONFIG} without --cpu",
            )
        else:
            add(
                "warning",
                "num-processes-ignored",
                f"distributed_type {dt} uses the simple launcher: ONE process starts, num_processes "
                f"{num_processes} is ignored. For several processes use MULTI_GPU (or {MULTI_CONFIG} on CPU)",
            )
    if launcher == "mpirun" and not env.mpirun_available:
        add(
            "error",
            "mpirun-missing",
            f"mpirun_config.mpirun_hostfile is set ({hostfile}) but neither mpirun nor mpiexec is installed; "
            f"accelerate launch fails. Install MPI or use {MULTI_CONFIG}",
        )

    if use_cpu and launcher in ("torchrun", "deepspeed"):
        if env.cuda_device_count > 0 and not hidden_by_gpu_ids and not hidden_by_env:
            add(
                "warning",
                "use-cpu-ignored",
                f"use_cpu: true is ignored by the {launcher} launcher (accelerate only passes it to the simple "
                f"launcher): the {per_machine} processes will use the GPUs. To train on CPU hide the GPUs "
                f"({MULTI_CONFIG}: gpu_ids '-1,-1')",
            )
        else:
            add("info", "use-cpu-ignored", f"use_cpu: true has no effect with the {launcher} launcher")

    if (
        dt in MULTI_DEVICE_TYPES
        and num_machines <= 1
        and raw_gpu_ids is not None
        and isinstance(raw_gpu_ids, str)
        and gpu_ids != "all"
        and len(gpu_ids.split(",")) < 2
    ):
        if hidden_by_gpu_ids:
            fix = "to hide every GPU write gpu_ids: '-1,-1' (CUDA still sees none, accelerate sees two ids)"
        else:
            fix = "list at least two GPUs, use gpu_ids: 'all', or for one GPU use distributed_type: 'NO'"
        add(
            "error",
            "too-few-gpu-ids",
            f"distributed_type {dt} on one machine with gpu_ids {gpu_ids!r}: accelerate launch refuses it "
            f"('Less than two GPU ids were configured'); {fix}",
        )

    if dt in CUDA_TYPES and launcher in ("torchrun", "deepspeed"):
        if env.cuda_device_count == 0 and not hidden_by_gpu_ids and not hidden_by_env:
            extra = "" if dt == "MULTI_GPU" else f" ({dt} itself may not support CPU)"
            add(
                "warning",
                "multi-gpu-without-gpu",
                f"distributed_type {dt} but this machine has no CUDA device: torchrun still starts {per_machine} "
                f"processes and train.py falls back to gloo DDP on CPU{extra}. To mean it, use {MULTI_CONFIG}",
            )
        elif device == "cpu" and (hidden_by_gpu_ids or hidden_by_env):
            hider = (
                f"gpu_ids {gpu_ids!r}" if hidden_by_gpu_ids else f"CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r}"
            )
            add(
                "info",
                "gpus-hidden",
                f"GPUs hidden on purpose by {hider}: torchrun starts {per_machine} ranks per machine and train.py "
                "joins them in a gloo process group on CPU",
            )

    if mp == "fp16" and device == "cpu":
        add(
            "warning",
            "fp16-on-cpu",
            "mixed_precision fp16 on CPU is silently ignored by accelerate (training runs in fp32); "
            "use mixed_precision: 'bf16', which works on CPU",
        )

    if launcher in ("torchrun", "deepspeed", "mpirun"):
        if device == "cuda" and per_machine > n_gpus:
            add(
                "error",
                "too-many-processes",
                f"{per_machine} processes per machine but only {_plural(n_gpus, 'GPU')} visible to them: each "
                f"process takes cuda:LOCAL_RANK, so local ranks {n_gpus}..{per_machine - 1} have no GPU. Set "
                f"num_processes to {n_gpus * num_machines} or fewer",
            )
        elif device == "cpu" and per_machine > env.cpu_count:
            add(
                "warning",
                "too-many-processes",
                f"{per_machine} CPU processes per machine but only {_plural(env.cpu_count, 'core')}: "
                "they will oversubscribe the CPU and run slower than fewer processes",
            )

    if gpu_ids_list and physical:
        missing = [g for g in gpu_ids_list if isinstance(g, int) and g >= physical]
        if missing:
            add(
                "error",
                "gpu-ids-missing",
                f"gpu_ids {gpu_ids!r} names GPU {missing[0]} but this machine has {_plural(physical, 'GPU')} "
                f"(0..{physical - 1}). gpu_ids are physical indices: accelerate sets CUDA_VISIBLE_DEVICES to "
                "gpu_ids, and inside the processes the chosen GPUs are renumbered from 0 "
                "(gpu_ids '2,3' -> cuda:0, cuda:1)",
            )
    if gpu_ids_list and env.cuda_visible_devices is not None and gpu_ids_list != env_ids:
        add(
            "warning",
            "gpu-ids-override-cvd",
            f"CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r} is set but accelerate replaces it with gpu_ids "
            f"{gpu_ids!r}: the processes see physical GPUs {gpu_ids}, renumbered from 0. To keep your "
            "selection, drop gpu_ids (or set gpu_ids: 'all')",
        )

    port = _as_int(cfg.get("main_process_port"), 29500)
    multi_process = world_size > 1 or num_machines > 1
    checks_port = launcher in ("torchrun", "deepspeed", "mpirun") and multi_process and port and port > 0
    if checks_port and (num_machines <= 1 or machine_rank == 0) and env.port_in_use(port):
        if num_machines <= 1 and launcher != "mpirun":
            add(
                "warning",
                "port-in-use",
                f"main_process_port {port} is in use (another run?); accelerate will warn and pick a free port. "
                "Set main_process_port: 0 to always pick one",
            )
        else:
            add(
                "error",
                "port-in-use",
                f"main_process_port {port} is in use on this machine (rank 0 of the rendezvous): the launch "
                "fails with ConnectionError. Stop the other run or choose another port in the config and on "
                "every machine",
            )

    if data_parallel:
        add(
            "info",
            "dp-single-process",
            f"distributed_type NO with {n_gpus} visible GPUs: one process; train.py wraps the model in "
            "nn.DataParallel. multi-process DDP (distributed_type MULTI_GPU) is faster",
        )
    elif dt == "NO" and device == "cpu" and env.cuda_device_count == 0 and gpu_ids_list:
        add("info", "no-gpu", f"gpu_ids {gpu_ids!r} but no CUDA device here: runs on CPU")

    if num_machines > 1:
        if not cfg.get("main_process_ip"):
            add(
                "error",
                "main-process-ip-missing",
                f"num_machines {num_machines} without main_process_ip: the other machines cannot find rank 0; "
                "set main_process_ip to the address of the machine with machine_rank 0",
            )
        if launcher in ("torchrun", "deepspeed", "mpirun") and num_processes % num_machines:
            add(
                "error",
                "num-processes-not-divisible",
                f"num_processes {num_processes} is not divisible by num_machines {num_machines}: torchrun would "
                f"start {num_processes // num_machines} per machine ({per_machine * num_machines} in all). "
                "num_processes is the TOTAL over all machines",
            )
        if not 0 <= machine_rank < num_machines:
            add(
                "error",
                "machine-rank-out-of-range",
                f"machine_rank {machine_rank} must be between 0 and num_machines - 1 ({num_machines - 1})",
            )
        if launcher == "simple" and cfg.get("main_process_port") is None:
            add(
                "error",
                "main-process-port-missing",
                "the simple launcher needs main_process_port when num_machines > 1 (accelerate asserts it)",
            )


# ---------------------------------------------------------------------------
# output


def report_dict(env: Environment, diagnoses: list[Diagnosis]) -> dict[str, Any]:
    return {
        "devices": devices_report(env),
        "configs": [d.to_dict() for d in diagnoses],
        "ok": all(d.ok for d in diagnoses),
    }


def format_json(env: Environment, diagnoses: list[Diagnosis]) -> str:
    return json.dumps(report_dict(env, diagnoses), indent=2, default=str)


def format_devices(report: dict[str, Any]) -> str:
    lines = ["== devices =="]
    versions = ", ".join(f"{k} {v or 'not installed'}" for k, v in report["versions"].items())
    if versions:
        lines.append(f"versions: {versions}")
    n = report["cuda_device_count"]
    names = report["cuda_device_names"]
    lines.append(f"CUDA devices visible: {n}" + (f" ({', '.join(names)})" if names else ""))
    lines.append(f"CUDA_VISIBLE_DEVICES: {report['cuda_visible_devices_note']}")
    for logical, phys in report["logical_to_physical"].items():
        lines.append(f"  {logical} = physical GPU {phys}")
    lines.append(f"try_gpu() -> {report['try_gpu']}; try_all_gpus() -> [{', '.join(report['try_all_gpus'])}]")
    lines.append(f"CPU cores: {report['cpu_count']}; mpirun: {'found' if report['mpirun_available'] else 'not found'}")
    if report["default_config_path"]:
        lines.append(
            f"default accelerate config: {report['default_config_path']} (used by accelerate launch without "
            "--config_file; check it with --config_file)"
        )
    else:
        lines.append("default accelerate config: none")
    return "\n".join(lines)


def format_diagnosis(diag: Diagnosis) -> str:
    lines = [f"== {diag.path} =="]
    plan = diag.plan
    if plan.get("summary"):
        lines.append(f"plan: {plan['summary']}")
    if plan:
        detail = ", ".join(
            f"{k} {plan[k]}"
            for k in (
                "launcher",
                "processes_per_machine",
                "num_machines",
                "world_size",
                "backend",
                "device",
                "mixed_precision",
                "distributed_type",
            )
            if k in plan
        )
        lines.append(f"  {detail}")
    for f in diag.findings:
        lines.append(f"  {f.level:<7} [{f.code}] {f.message}")
    n_err, n_warn = len(diag.errors), len(diag.warnings)
    lines.append(
        "verdict: " + ("OK" if not n_err else "BROKEN") + f" ({_plural(n_err, 'error')}, {_plural(n_warn, 'warning')})"
    )
    return "\n".join(lines)


def format_report(env: Environment, diagnoses: list[Diagnosis]) -> str:
    parts = [format_devices(devices_report(env))]
    parts.extend(format_diagnosis(d) for d in diagnoses)
    return "\n\n".join(parts) + "\n"
