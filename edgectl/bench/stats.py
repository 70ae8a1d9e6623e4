"""Medians, extremes and ratios of per-pass numbers (None = not measured, never 0)."""

from __future__ import annotations

from collections.abc import Sequence


def median(values: Sequence[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def minimum(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def maximum(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is unknown or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b
