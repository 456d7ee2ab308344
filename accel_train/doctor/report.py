"""The doctor's report: text for people, JSON for tools."""

from __future__ import annotations

import json
from typing import Any

from accel_train.doctor.configfile import CUDA_TYPES, Diagnosis, _plural
from accel_train.doctor.environment import Environment, devices_report
from accel_train.doctor.plan import LaunchPlan
from accel_train.doctor.ranks import run_mixed_precision
from accel_train.runtime import fp16_ignored

# what a run records in summary.json (and config.yaml's "resolved"), and --smoke compares
RUN_KEYS = ("world_size", "distributed_type", "device", "mixed_precision", "data_parallel")


def _why_cpu(plan: LaunchPlan, env: Environment) -> str:
    if plan.device != "cpu":
        return ""
    if plan.cpu_flag:
        return " (accelerate launch --cpu)"
    if plan.relaunch:
        return " (ranks started by train.py: accelerate's simple launcher starts one process)"
    if plan.hidden_by_gpu_ids:
        return f" (GPUs hidden by gpu_ids {plan.args.gpu_ids!r})"
    if plan.hidden_by_env:
        return f" (GPUs hidden by CUDA_VISIBLE_DEVICES={env.cuda_visible_devices!r})"
    if plan.launched_env.get("ACCELERATE_USE_CPU", "").lower() == "true":
        return " (use_cpu: true)"
    if plan.dt in CUDA_TYPES and plan.launcher in ("torchrun", "deepspeed"):
        return " (no CUDA device: train.py's fallback)"
    return ""


def _summary(plan: LaunchPlan, env: Environment) -> str:
    if plan.refusal:
        return f"train.py refuses to run: the simple launcher starts ONE of {plan.args.num_processes} processes"
    why_cpu = _why_cpu(plan, env)
    procs = _plural(plan.world_size, "process")
    machines = plan.args.num_machines
    multi_machine = machines > 1 and plan.launcher != "simple"
    if multi_machine:
        rank = plan.args.machine_rank
        procs += f" ({plan.per_machine} per machine x {machines} machines; this is machine rank {rank})"
    if plan.world_size > 1 or multi_machine:
        if plan.device == "cuda":
            where = f"on {_plural(plan.n_gpus, 'GPU')}" + (" per machine" if machines > 1 else "")
        else:
            where = "on CPU" if plan.device == "cpu" else f"on {plan.device}"
        return f"{procs}, {plan.backend or plan.dt} DDP {where}{why_cpu}"
    if plan.data_parallel:
        return f"1 process, nn.DataParallel over {plan.n_gpus} GPUs"
    if plan.device == "cuda":
        return f"1 process on cuda:0 (of {_plural(plan.n_gpus, 'visible GPU')})"
    return f"1 process on {plan.device}{why_cpu}"


def describe(plan: LaunchPlan, env: Environment) -> dict[str, Any]:
    """The plan as the report shows it (``Diagnosis.plan``); ``run`` is what the run will record."""
    run = (plan.world_size, plan.run_dt, plan.device, run_mixed_precision(plan), plan.data_parallel)
    ignored = fp16_ignored(plan.mp, plan.device)
    return {
        "summary": _summary(plan, env),
        "launcher": plan.launcher,
        "relaunch": plan.relaunch,
        "processes_per_machine": plan.per_machine,
        "num_machines": plan.args.num_machines,
        "machine_rank": plan.args.machine_rank,
        "world_size": plan.world_size,
        "backend": plan.backend,
        "device": plan.device,
        "visible_gpus": plan.n_gpus if plan.device == "cuda" else 0,
        "gpu_ids": plan.args.gpu_ids,
        "cuda_visible_devices": plan.cuda_visible_devices,
        "mixed_precision": "no (fp16 ignored on CPU)" if ignored else plan.mp,
        "distributed_type": plan.dt,
        "data_parallel": plan.data_parallel,
        "run": None if plan.refusal else dict(zip(RUN_KEYS, run, strict=True)),
    }


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
    if diag.smoke is not None:
        lines.extend(format_smoke(diag.smoke))
    for f in diag.findings:
        lines.append(f"  {f.level:<7} [{f.code}] {f.message}")
    n_err, n_warn = len(diag.errors), len(diag.warnings)
    lines.append(
        "verdict: " + ("OK" if not n_err else "BROKEN") + f" ({_plural(n_err, 'error')}, {_plural(n_warn, 'warning')})"
    )
    return "\n".join(lines)


def format_smoke(smoke: dict[str, Any]) -> list[str]:
    """The plan and the observed run side by side."""
    if "skipped" in smoke:
        return [f"smoke: not launched: {smoke['skipped']}"]
    code = "timed out" if smoke["exit_code"] is None else f"exit {smoke['exit_code']}"
    folder = smoke["run_dir"] + ("" if smoke["kept"] else " (removed)")
    lines = [f"smoke: {smoke['command']}", f"  {code} after {smoke['seconds']} s; run folder {folder}"]
    lines.append(f"  {'':<18}{'plan':<16}observed")
    for key in RUN_KEYS:
        seen = smoke["observed"].get(key, "-")
        mark = "   <- differs" if key in smoke["differs"] else ""
        lines.append(f"  {key:<18}{smoke['expected'].get(key)!s:<16}{seen}{mark}")
    verdict = "did not run" if not smoke["observed"] else "DIFFERS" if smoke["differs"] else "matches the plan"
    lines.append(f"  smoke verdict: {verdict}")
    return lines


def format_report(env: Environment, diagnoses: list[Diagnosis]) -> str:
    parts = [format_devices(devices_report(env))]
    parts.extend(format_diagnosis(d) for d in diagnoses)
    return "\n\n".join(parts) + "\n"
