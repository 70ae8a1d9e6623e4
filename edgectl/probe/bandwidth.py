"""``--bandwidth``: a short multi-threaded memory copy (≤ 2 s of copying), as a median in GB/s.

Decode speed on a CPU is bounded by memory bandwidth (every weight is read once per token), so
the planner and bench use this figure. No numpy (not a control-plane dependency): each thread
calls libc ``memmove`` through ctypes, which releases the GIL for the duration of the call, so
the threads copy in parallel. One thread per usable CPU, each pinned to its CPU.

What is counted: 2 × bytes copied (each byte is read once and written once). Write-allocate
traffic (the cache line read before a write on x86 without non-temporal stores) is not counted,
so the DRAM traffic can be up to 1.5× the figure; glibc uses non-temporal stores for copies this
large, which avoids most of it. Buffers are sized to exceed the last-level cache so the copy
goes to memory, within a quarter of the memory budget.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from dataclasses import dataclass

MIB = 1024 * 1024
_MIN_TOTAL_BYTES = 64 * MIB
_MAX_TOTAL_BYTES = 1024 * MIB
_TARGET_TOTAL_BYTES = 256 * MIB


@dataclass(frozen=True)
class BandwidthResult:
    gbps: float  # median, decimal GB/s (1e9 bytes), read + write bytes
    threads: int
    bytes_per_thread: int  # bytes copied per thread per repetition
    repetitions: int

    def describe(self) -> str:
        return (f"bandwidth: median of {self.repetitions} copies by {self.threads} thread(s), "
                f"{self.bytes_per_thread // MIB} MiB each; counts read + write bytes "
                "(2 × bytes copied), not write-allocate traffic")


class BandwidthUnavailable(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def buffer_total_bytes(llc_bytes: int | None, budget_bytes: int | None) -> int:
    """Source + destination bytes over all threads: ≥ 2× the LLC, ≤ 1 GiB and ≤ budget / 4."""
    want = max(_TARGET_TOTAL_BYTES, 2 * (llc_bytes or 0))
    cap = _MAX_TOTAL_BYTES if budget_bytes is None else min(_MAX_TOTAL_BYTES, budget_bytes // 4)
    total = min(want, cap)
    if total < _MIN_TOTAL_BYTES:
        raise BandwidthUnavailable(f"the memory budget leaves {total // MIB} MiB for the copy buffers; "
                                   f"at least {_MIN_TOTAL_BYTES // MIB} MiB are needed")
    return total


class _PinnedCopiers:
    """One thread per CPU, pinned to it, copying its own buffer of ``per_thread`` bytes each time
    the ``start`` barrier releases them all; ``done`` is passed when every copy has finished."""

    def __init__(self, cpus: list[int], per_thread: int) -> None:
        n = len(cpus)
        self.cpus, self.per_thread = cpus, per_thread
        self.buffers = [(bytearray(per_thread), bytearray(per_thread)) for _ in range(n)]
        self.addresses = [(ctypes.addressof((ctypes.c_char * per_thread).from_buffer(src)),
                           ctypes.addressof((ctypes.c_char * per_thread).from_buffer(dst)))
                          for src, dst in self.buffers]
        self.start = threading.Barrier(n + 1)
        self.done = threading.Barrier(n + 1)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._copy, args=(i,), daemon=True) for i in range(n)]

    def _copy(self, i: int) -> None:
        try:
            os.sched_setaffinity(0, {self.cpus[i]})  # 0 = the calling thread on Linux
        except OSError:
            pass  # pinning is an optimisation; the copy still measures
        src, dst = self.addresses[i]
        try:
            while True:
                self.start.wait()
                if self.stop.is_set():
                    return
                ctypes.memmove(dst, src, self.per_thread)
                self.done.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # pragma: no cover - reported to the caller
            self.errors.append(exc)
            self.done.abort()
            self.start.abort()

    def start_threads(self) -> None:
        for t in self.threads:
            t.start()

    def touch_buffers(self, timeout_s: float) -> None:
        """The first pass: it touches the fresh buffers (page faults), so it is not a copy rate."""
        self.start.wait()
        self.done.wait(timeout=timeout_s)

    def copy_once(self) -> float:
        """One copy by every thread at once: the seconds from their release to the last one done."""
        t0 = time.perf_counter()
        self.start.wait()
        self.done.wait()
        return time.perf_counter() - t0

    def close(self) -> None:
        # releases every worker: one waiting to start returns, one mid-copy returns after it
        self.stop.set()
        self.start.abort()
        self.done.abort()
        for t in self.threads:
            t.join(timeout=30)


def measure(cpus: list[int], total_bytes: int, *, max_seconds: float = 2.0,
            max_repetitions: int = 9, warmup_timeout_s: float = 10.0) -> BandwidthResult:
    """Copy ``total_bytes / 2`` bytes split over one pinned thread per CPU, repeatedly, and
    return the median rate. The first pass touches the fresh buffers (page faults, which in a
    VM can also fault on the host side) and is not timed; then copies repeat until
    ``max_repetitions`` or until another one would pass ``max_seconds`` of copying."""
    if not cpus:
        raise BandwidthUnavailable("no usable CPUs")
    n = len(cpus)
    per_thread = max(MIB, (total_bytes // (2 * n)) // 4096 * 4096)
    copiers = _PinnedCopiers(cpus, per_thread)
    copiers.start_threads()
    rates: list[float] = []
    timed_out = False
    try:
        try:
            copiers.touch_buffers(warmup_timeout_s)
        except threading.BrokenBarrierError:
            timed_out = not copiers.errors
            raise
        copying = 0.0
        while len(rates) < max_repetitions:
            dt = copiers.copy_once()
            copying += dt
            rates.append(2 * per_thread * n / dt / 1e9)
            if copying + dt > max_seconds:
                break
    except threading.BrokenBarrierError:
        pass
    finally:
        copiers.close()
    if copiers.errors:
        raise BandwidthUnavailable(f"the copy failed: {copiers.errors[0]}")
    if timed_out or not rates:
        raise BandwidthUnavailable(f"touching {2 * per_thread * n // MIB} MiB of fresh buffers took over "
                                   f"{warmup_timeout_s:g} s: the machine is too busy (or swapping) to measure")
    return BandwidthResult(gbps=round(statistics.median(rates), 2), threads=n,
                           bytes_per_thread=per_thread, repetitions=len(rates))
