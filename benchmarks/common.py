"""Small helpers the harness's parts share: medians and ratios that tolerate a missing measurement (a failed run
reads as ``None``), the tail of a child's output for an error line, reading a child's JSON, the new lines of a file
a child is writing, the number formats of the reports, and the CPU the numbers come from."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _median(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The lines completed in ``path`` (a file a child is still writing) past ``offset``, and the new offset; a
    half-written last line waits for the next call. No file yet: nothing."""
    if not path.is_file():
        return [], offset
    with open(path) as fh:
        fh.seek(offset)
        chunk = fh.read()
    complete = chunk[: chunk.rfind("\n") + 1]
    return complete.splitlines(), offset + len(complete)


def _f(value: Any, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    return format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[met]


def cpu_description() -> dict[str, Any]:
    """The CPU's model and bf16 features, as accel_train reads them (its run header, the doctor)."""
    import platform

    from accel_train.runtime import cpu_bf16_kind, cpu_flags

    model, text = platform.processor() or platform.machine(), ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    for line in text.splitlines():
        if line.startswith("model name") and ":" in line:
            model = line.split(":", 1)[1].strip()
            break
    flags = cpu_flags(text) or set()
    return {
        "cpu": model,
        "cpu_bf16_kind": cpu_bf16_kind(text),  # the product's own reading (run header, doctor)
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx512f": "avx512f" in flags,
    }
