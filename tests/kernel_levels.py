"""The ISA levels of edgectl's kernels a test runs here: every level this CPU can run, and in the AVX2
tier nothing above AVX2 (the ``kernel_level`` fixture of tests/conftest.py takes each in turn)."""

from __future__ import annotations

from isa_helpers import TIER

from edgectl_runtime.kernels import ops


def skip_reason(level: str) -> str | None:
    """Why this machine (or tier) does not run ``level``, or None."""
    if level not in ops.supported_levels():
        return f"this CPU cannot run the {level} kernels (it runs {ops.supported_levels()})"
    if TIER == "avx2" and level in ("avxvnni", "avx512vnni"):
        return "the AVX2 tier runs nothing above AVX2"
    return None


def runnable_levels() -> list[str]:
    """The levels this CPU can run, held to AVX2 in the AVX2 tier (the kernels built: else a failure)."""
    ok, why = ops.available()
    assert ok, why
    return [lv for lv in ops.supported_levels() if skip_reason(lv) is None]
