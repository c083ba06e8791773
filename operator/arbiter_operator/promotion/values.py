"""What an analysis reads from Prometheus's answers, and how its messages write numbers (pure).

Anything Prometheus (or a proxy in front of it) may hand back passes through `as_number` and `counts`, which turn
everything but a finite number into no data: no answer can crash an analysis or pass a candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def as_number(value: Any) -> float | None:
    """A finite float, or None for anything else Prometheus (or a broken proxy) may hand back."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def counts(value: Any) -> dict[str, float]:
    """A {key: count} mapping with only finite, non-negative counts (counter increases can't be negative)."""
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, raw in value.items():
        n = as_number(raw)
        if isinstance(key, str) and n is not None and n >= 0:
            out[key] = n
    return out


def count(values: Mapping[str, Any], name: str) -> float:
    """A count that may be absent: a missing series only means nothing of the kind happened yet."""
    return max(0.0, as_number(values.get(name)) or 0.0)


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def ms(value: float | None) -> str:
    return fmt(value, "ms")


def points(value: float) -> str:
    """A difference of shares, in percentage points with its sign."""
    return f"{value * 100:+.2f}"
