"""What llama-server's log says it did: the threads it runs and the weights its CPU backend repacked.

llama.cpp's CPU backend keeps a tensor it can lay out for its interleaved GEMV/GEMM kernels
(Q4_0, Q4_K, IQ4_NL, Q8_0 … on x86: ``ggml/src/ggml-cpu/repack.cpp``,
``ggml_repack_get_optimal_repack_type``) in a buffer of its own, ``CPU_REPACK``; the rest stays
in the memory-mapped file (``CPU_Mapped``). The log lines read here, by their format strings:

- ``src/llama-model.cpp`` (``load_tensors``, info level):
  ``"%s: %12s model buffer size = %8.2f MiB"`` — one line per buffer type, e.g.
  ``load_tensors:   CPU_REPACK model buffer size =    56.95 MiB``. llama-server prints it from
  verbosity 4 (``-lv 4``; its default, 3, leaves the model loader's lines out), which is why the
  bench starts it with ``-lv 4``: that level adds no line per decoded token.
- ``ggml/src/ggml-cpu/repack.cpp`` (``repack``, debug level):
  ``"%s: repack tensor %s with %s_%dx%d"``, e.g. ``repack: repack tensor blk.0.attn_q.weight
  with q4_0_8x8`` — one line per tensor, printed only at ``-lv 5``, which also logs ~17 lines per
  decoded token; the bench does not run at that level, but a log that has the lines is read.
- ``common/common.cpp`` / the thread pool: ``n_threads = N`` (``system_info: n_threads = 2
  (n_threads_batch = 2) / 2``, ``llama threadpool init, n_threads = 2``).

The load can run twice (a sizing pass, then the real one, at ``-lv 5``): the last line of a
buffer type is the one that holds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

VERBOSITY = 4  # llama-server -lv: the level whose log has the model buffers and nothing per token
REPACK_BUFFER = "CPU_REPACK"
MIB = 1024 * 1024

_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")
_REPACK_TENSOR = re.compile(r"repack: repack tensor (\S+) with (\S+)")
_THREADS = re.compile(r"n_threads\s*=\s*(\d+)")


def threads(lines: Iterable[str]) -> int | None:
    """The last ``n_threads = N`` of the log (None: not logged)."""
    found = None
    for line in lines:
        m = _THREADS.search(line)
        if m:
            found = int(m.group(1))
    return found


def repack(lines: Iterable[str]) -> dict[str, Any]:
    """The model's buffers by type, the bytes repacked, and (debug logs only) the tensors per layout.

    ``repacked``: True when a ``CPU_REPACK`` buffer of more than 0 bytes was made, False when the
    buffers were logged and none was, None when the log has no buffer line (nothing to say)."""
    buffers: dict[str, float] = {}
    layouts: dict[str, str] = {}
    for line in lines:
        m = _BUFFER.search(line)
        if m:
            buffers[m.group(1)] = float(m.group(2))
            continue
        m = _REPACK_TENSOR.search(line)
        if m:
            layouts[m.group(1)] = m.group(2)
    repacked_mib = buffers.get(REPACK_BUFFER, 0.0)
    return {
        "buffers_mib": buffers,
        "repacked_bytes": round(repacked_mib * MIB) if buffers else None,
        "repacked": (repacked_mib > 0) if buffers else None,
        # tensor counts per repacked layout, e.g. {"q4_0_8x8": 210}; None: the log is not at debug level
        "layouts": dict(Counter(layouts.values())) if layouts else None,
        "read_from": "llama-server's log: load_tensors' model buffer sizes (src/llama-model.cpp), and the "
                     "repack lines (ggml/src/ggml-cpu/repack.cpp) when logged at debug level",
    }


def describe(facts: dict[str, Any]) -> str:
    """One phrase: what was repacked, e.g. ``CPU_REPACK 56.95 MiB (beside CPU_Mapped 85.30 MiB)``."""
    buffers = facts.get("buffers_mib") or {}
    if not buffers:
        return "no model buffer in the log (not read)"
    others = ", ".join(f"{k} {v:.2f} MiB" for k, v in buffers.items() if k != REPACK_BUFFER)
    mib = buffers.get(REPACK_BUFFER, 0.0)
    text = (f"{REPACK_BUFFER} {mib:.2f} MiB repacked (beside {others})" if mib > 0
            else f"nothing repacked ({others})")
    if facts.get("layouts"):
        text += ": " + ", ".join(f"{n} tensors as {layout}" for layout, n in sorted(facts["layouts"].items()))
    return text
