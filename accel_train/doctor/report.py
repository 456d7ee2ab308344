"""The doctor's report: text for people, JSON for tools."""

from __future__ import annotations

import json
from typing import Any

from accel_train.doctor.configfile import Diagnosis, _plural
from accel_train.doctor.environment import Environment, devices_report


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
