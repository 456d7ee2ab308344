"""JSON without ``NaN``: Python's ``json`` writes a non-finite float as the bare word ``NaN`` or ``Infinity``, which
is not JSON (``jq``, JavaScript and most parsers reject the whole file). Every JSON file and line accel_train writes
goes through :func:`finite`: a non-finite number becomes ``null``, with one warning line on stderr naming where."""

from __future__ import annotations

import math
import sys
from typing import Any


def finite(value: Any, what: str = "JSON", hint: str = "") -> Any:
    """``value`` with every non-finite float replaced by None; one ``warning:`` line on stderr says which fields
    of ``what`` were (and ``hint``, what it may mean)."""
    found: list[str] = []
    clean = _walk(value, "", found)
    if found:
        names = sorted(set(found))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        print(f"warning: {shown} not finite (NaN or Inf), written as null in {what}" + (f"; {hint}" if hint else ""),
              file=sys.stderr, flush=True)  # fmt: skip
    return clean


def _walk(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path or "the value")
        return None
    if isinstance(value, dict):
        return {k: _walk(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, path, found) for v in value]
    return value
