"""``diagnose_config``: read an accelerate config file, predict its launch, list its traps."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import yaml

from accel_train.doctor.checks import add_traps
from accel_train.doctor.configfile import Diagnosis, _known_keys, _yaml_scan
from accel_train.doctor.environment import Environment
from accel_train.doctor.plan import describe, read_plan
from accel_train.errors import UserError


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

    plan = read_plan(cfg, env, diag, cpu=cpu)
    if plan is not None:
        diag.plan = describe(plan, env)
        add_traps(cfg, plan, env, diag)
    return diag
