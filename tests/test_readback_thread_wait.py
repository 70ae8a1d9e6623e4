"""The worker reports how its OpenMP threads wait as libgomp read it from the environment."""

from __future__ import annotations

import pytest

readback = pytest.importorskip("edgectl_runtime.service.readback")


@pytest.mark.parametrize("value, reported", [("PASSIVE", "passive"), ("passive ", "passive"), ("ACTIVE", "active"),
                                             (None, "spin")])
def test_thread_wait_follows_omp_wait_policy(monkeypatch, value, reported):
    if value is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", value)
    assert readback.thread_wait() == reported


@pytest.mark.parametrize("count, reported", [("10000", "spin-short"), ("5", "spin-5")])
def test_a_spin_count_is_reported(monkeypatch, count, reported):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", count)
    assert readback.thread_wait() == reported
