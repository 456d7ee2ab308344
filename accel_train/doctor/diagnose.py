"""``diagnose_config``: read an accelerate config file, ask accelerate how it launches, list its traps."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from accel_train.doctor.checks import add_traps, refused
from accel_train.doctor.configfile import Diagnosis, _known_keys, _yaml_scan, check_counts, check_distributed_type
from accel_train.doctor.environment import Environment
from accel_train.doctor.plan import Refused, resolve
from accel_train.doctor.ranks import rank_side
from accel_train.doctor.report import describe
from accel_train.errors import UserError

Nodes = dict[str, tuple[yaml.Node, yaml.Node]]


def _parse(path: Path, text: str, diag: Diagnosis) -> tuple[dict[str, Any], Nodes] | None:
    """The file's mapping and (YAML) its top-level nodes; None when it is not a mapping (said in ``diag``)."""
    if path.suffix == ".json":
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            diag.add("error", "json-parse-error", f"not valid JSON: {e}")
            return None
        if not isinstance(cfg, dict):
            diag.add("error", "not-a-mapping", "an accelerate config must be a JSON object")
            return None
        return cfg, {}
    top = _yaml_scan(text, diag)
    if top is None:
        return None
    try:
        return yaml.safe_load(text), top
    except yaml.YAMLError as e:
        diag.add("error", "yaml-parse-error", f"not valid YAML: {' '.join(str(e).split())}")
        return None


def _check_keys(path: Path, cfg: dict[str, Any], top: Nodes, sagemaker: bool, diag: Diagnosis) -> None:
    """Unknown keys (with the closest known one), then accelerate's own loader."""
    known = _known_keys(sagemaker)
    unknown = [k for k in cfg if known and str(k) not in known]
    for key in unknown:
        line = f"line {top[str(key)][0].start_mark.line + 1}: " if str(key) in top else ""
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else "; remove it"
        kind = "SageMakerConfig" if sagemaker else "ClusterConfig"
        diag.add(
            "error", "unknown-key", f"{line}{key!r} is not an accelerate {kind} key (accelerate refuses the file){hint}"
        )
    try:
        from accelerate.commands.config.config_args import load_config_from_file

        load_config_from_file(str(path))
    except Exception as e:  # noqa: BLE001 - reported as a finding, not a traceback
        message = " ".join(str(e).split())
        if not (unknown and "unknown keys" in message):
            diag.add("error", "config-load-failed", f"accelerate cannot load it: {type(e).__name__}: {message}")


def check_config_file(path: str | Path) -> tuple[Diagnosis, dict[str, Any] | None]:
    """The file on its own (no launch plan): its YAML or JSON, keys, distributed_type and counts, as accelerate's
    loader and launchers take them. Returns the findings and the file's mapping (None when it is not one).

    Raises ``UserError`` when the file does not exist or cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"accelerate config file not found: {path}")
    diag = Diagnosis(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read accelerate config file {path}: {e}") from e
    parsed = _parse(path, text, diag)
    if parsed is None:
        return diag, None
    cfg, top = parsed
    sagemaker = cfg.get("compute_environment") == "AMAZON_SAGEMAKER"
    _check_keys(path, cfg, top, sagemaker, diag)
    check_distributed_type(cfg, diag)
    if not sagemaker or diag.errors:  # a SageMaker config's counts are SageMaker's
        check_counts(cfg, diag)
    return diag, cfg


def diagnose_config(
    path: str | Path, env: Environment, *, cpu: bool = False, launch_args: Sequence[str] = ()
) -> Diagnosis:
    """Predict what ``accelerate launch [--cpu] [launch_args] --config_file path`` does on ``env``; list its traps.

    Raises ``UserError`` when the file does not exist.
    """
    diag, cfg = check_config_file(path)
    if cfg is None:
        return diag
    if cfg.get("compute_environment") == "AMAZON_SAGEMAKER" and not diag.errors:
        diag.plan = {"launcher": "sagemaker", "distributed_type": cfg.get("distributed_type"), "num_machines": 1}
        diag.add("info", "sagemaker-not-checked", "AMAZON_SAGEMAKER configs run remotely; only the file was checked")
        return diag
    if diag.errors:  # accelerate refuses the file, or its launcher would crash on it: said above
        return diag
    try:
        plan = resolve(str(path), env, ("--cpu",) * cpu + tuple(launch_args))
    except Refused as refusal:
        refused(refusal, cfg, diag)
        return diag
    rank_side(plan, env)
    diag.plan = describe(plan, env)
    add_traps(plan, env, diag)
    return diag
