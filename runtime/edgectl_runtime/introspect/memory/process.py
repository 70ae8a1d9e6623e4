"""The memory-relevant settings this process runs with, read inside it (for the read-back)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any


def process_settings() -> dict[str, Any]:
    """The memory-relevant settings this process runs with, read inside it (for the read-back)."""
    from edgectl_runtime.vllm_plugin.lean import optional_imports_state

    return {"python_optimize": sys.flags.optimize, "optional_imports": optional_imports_state(),
            "environ": {k: os.environ.get(k) for k in ("LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_",
                                                       "PYTHONOPTIMIZE", "OMP_NUM_THREADS")},
            "threads": threading.active_count(), "modules": len(sys.modules),
            "modules_by_package": _modules_by_package()}


def _modules_by_package(top: int = 25) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in list(sys.modules):
        root = name.split(".", 1)[0]
        counts[root] = counts.get(root, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])
