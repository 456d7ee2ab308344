"""The machine as the doctor sees it: GPUs, CUDA_VISIBLE_DEVICES, cores, mpirun, versions, ports, routes."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accel_train.netif import Route, hostname_address, route_to


def port_in_use(port: int) -> bool:
    """accelerate's own check (``accelerate.utils.is_port_in_use``): can we connect to localhost:port?"""
    from accelerate.utils import is_port_in_use

    return is_port_in_use(int(port))


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
    cpu_bf16: str = "unknown"  # runtime.cpu_bf16_kind(): amx | avx512_bf16 | none | unknown
    # the network (netif.py), None where unknown (a machine described by hand): the route to an address, and the
    # hostname with the address it resolves to (gloo's own choice of address)
    route_to: Callable[[str], Route | None] | None = None
    hostname: tuple[str, str | None] | None = None

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

        from accel_train.runtime import available_cores, cpu_bf16_kind

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
            except OSError:  # no libnvidia-ml: no NVIDIA driver, so no CUDA GPU at all
                physical = 0
            except Exception:  # noqa: BLE001 - NVML there but unusable: unknown
                physical = None
        default_config = _default_config_path()
        return cls(
            cuda_device_count=count,
            cuda_device_names=names,
            cpu_count=available_cores(),
            cuda_visible_devices=cvd,
            mpirun_available=shutil.which("mpirun") is not None or shutil.which("mpiexec") is not None,
            versions=_versions(),
            default_config_path=default_config,
            port_in_use=port_in_use,
            physical_gpu_count=physical,
            cpu_bf16=cpu_bf16_kind(),
            route_to=route_to,
            hostname=(socket.gethostname(), hostname_address()),
        )


def _parse_uuids(value: str, prefix: str) -> list[str]:
    uuids: list[str] = []
    for elem in value.split(","):
        if elem in uuids:
            return []
        if not elem.startswith(prefix):
            break
        uuids.append(elem)
    return uuids


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
            return _parse_uuids(value, prefix)
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
