"""An accelerate config file: its keys, the YAML 1.1 traps in it, and the findings about it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml


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
    smoke: dict[str, Any] | None = None  # --smoke: the 2-step launch and what it recorded

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
            **({"smoke": self.smoke} if self.smoke is not None else {}),
        }

    def add(self, level: str, code: str, message: str) -> None:
        self.findings.append(Finding(level, code, message))


MULTI_CONFIG = "accelerate_configs/multi_cpu.yaml"
# distributed types meant for CUDA GPUs (train.py falls back to gloo on CPU without one)
CUDA_TYPES = {"MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM"}

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


def check_distributed_type(cfg: dict[str, Any], diag: Diagnosis) -> None:
    """A distributed_type accelerate can pick a launcher from: present, and a string."""
    raw = cfg.get("distributed_type")
    if raw is None and "distributed_type" not in cfg:
        diag.add("error", "distributed-type-missing", "the config has no distributed_type; e.g. distributed_type: 'NO'")
    elif raw is not None and not isinstance(raw, str) and "unquoted-yaml-scalar" not in diag.codes():
        diag.add("error", "invalid-value", f"distributed_type {raw!r} is not a string such as 'NO' or 'MULTI_GPU'")


def check_counts(cfg: dict[str, Any], diag: Diagnosis) -> None:
    """accelerate takes these as they are: a string crashes the launcher, 0 processes start nothing useful."""
    low = []
    for key in ("num_processes", "num_machines", "machine_rank"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            diag.add("error", "invalid-value", f"{key}: {value!r} is not an integer (accelerate's launchers need one)")
        elif key != "machine_rank" and value is not None and value < 1 and value != -1:
            low.append(f"{key}: {value}")  # -1: num_processes left out, accelerate says so itself
    if low:
        diag.add(
            "error",
            "invalid-value",
            f"{', '.join(low)} is invalid: num_processes and num_machines must be at least 1 (accelerate launch "
            "fails or ignores it); e.g. num_processes: 1",
        )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")
