"""The idle trim (runtime/edgectl_runtime/service/idle_trim.py): when it trims, and that glibc's trim
really returns memory a thread freed in the middle of its arena (the engine test reads the lever
back from a live worker: test_worker_api.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgectl_runtime.service.idle_trim import IdleTrimmer


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _trimmer():
    clock, calls = Clock(), []
    t = IdleTrimmer(idle_s=1.0, trim=lambda pad: calls.append(pad), clock=clock, rss=lambda: None)
    return t, clock, calls


def test_it_trims_once_per_quiet_period():
    t, clock, calls = _trimmer()
    assert not t.beat(0)  # nothing happened yet: nothing to give back
    clock.t += 5
    assert not t.beat(0) and calls == []
    # a request: its steps, then quiet
    t.request_started()
    for step in range(1, 6):
        clock.t += 0.1
        assert not t.beat(step)
    t.request_finished()
    clock.t += 0.5
    assert not t.beat(5)  # quiet for 0.5 s only
    clock.t += 0.6
    assert t.beat(5) and calls == [0]
    clock.t += 10
    assert not t.beat(5) and calls == [0]  # still quiet: once is enough
    assert t.state()["trims"] == 1 and t.state()["enabled"] is True


def test_it_waits_for_requests_in_flight_and_counts_a_finished_request_as_activity():
    t, clock, calls = _trimmer()
    t.request_started()
    t.beat(3)
    clock.t += 30
    assert not t.beat(3)  # a request still in flight (the response is being built): no trim
    t.request_finished()  # activity: the quiet starts now
    assert not t.beat(3)
    clock.t += 1.0
    assert t.beat(3) and calls == [0]
    # a request that ran no engine step (say, /v1/models) still counts
    t.request_started()
    t.request_finished()
    assert not t.beat(3)
    clock.t += 1.0
    assert t.beat(3) and len(calls) == 2


def test_without_glibc_it_never_trims_and_says_so():
    clock = Clock()
    t = IdleTrimmer(idle_s=1.0, clock=clock, rss=lambda: None)
    t._trim = None  # what a C library without malloc_trim leaves
    t.beat(1)
    clock.t += 5
    assert not t.beat(1)
    assert t.state()["available"] is False


# A thread allocates 160 MiB in 1 KiB blocks (glibc gives it an arena of its own, as vLLM's
# threads have), frees all but every 64th (so no heap's top is free and glibc's own trimming
# returns nothing), then the trimmer runs: RssAnon before, after glibc's free, after the trim.
_FRAGMENTED = r"""
import ctypes, json, sys, threading
sys.path[:0] = [sys.argv[1]]
from edgectl_runtime.service.idle_trim import IdleTrimmer, rss_anon_bytes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
out = {"start": rss_anon_bytes()}
def work():
    blocks = [libc.malloc(1024) for _ in range(160 * 1024)]
    for b in blocks:
        ctypes.memset(b, 1, 1024)
    out["allocated"] = rss_anon_bytes()
    for i, b in enumerate(blocks):
        if i % 64:
            libc.free(b)
    out["freed"] = rss_anon_bytes()
th = threading.Thread(target=work)
th.start(); th.join()
clock = [0.0]
t = IdleTrimmer(idle_s=1.0, clock=lambda: clock[0])
t.beat(1)
clock[0] = 2.0
out["trimmed"] = t.beat(1)
out["after"] = rss_anon_bytes()
out["state"] = t.state()
print(json.dumps(out))
"""


def test_glibcs_trim_returns_what_a_thread_freed_in_the_middle_of_its_arena():
    runtime = str(Path(__file__).resolve().parents[1] / "runtime")
    done = subprocess.run([sys.executable, "-c", _FRAGMENTED, runtime], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    mib = 1 << 20
    assert r["allocated"] - r["start"] > 150 * mib, r
    assert r["freed"] - r["start"] > 140 * mib, r  # freed, yet still resident: what glibc keeps
    assert r["trimmed"] is True
    assert r["freed"] - r["after"] > 120 * mib, r  # the trim gave it back
    assert r["state"]["released_bytes"] > 120 * mib and r["state"]["trims"] == 1, r
