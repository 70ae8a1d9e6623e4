"""The one registry of environment variables (edgectl/contract/environment.py): every variable
edgectl sets anywhere is declared there, and edgectl's own are read only through it."""

from __future__ import annotations

import pytest
from plan_helpers import host_facts, make_plan, shape
from probe_helpers import FIXTURE_NAMES

from edgectl.contract import environment
from edgectl.contract.environment import REGISTRY, Role
from edgectl.errors import EdgectlError
from edgectl.units import unit_environment


def declared(names, role: Role | None = None) -> list[str]:
    """The names that are not declared (with that role)."""
    return [n for n in names if n not in REGISTRY or (role is not None and REGISTRY[n].role is not role)]


def test_every_variable_a_plan_sets_is_declared():
    checked = 0
    for host in FIXTURE_NAMES:
        for levers in ({}, {"topology": "stock"}, {"topology": "stock", "reserve_frontend_core": True},
                       {"weight_format": "bf16"}):
            try:
                p = make_plan(host_facts(host), shape("smollm2-135m"), **levers)
            except EdgectlError:  # a request this host cannot serve (the stock topology does not fit): nothing set
                continue
            assert declared(p.env, Role.SET) == [], (host, levers)
            assert declared(environment.runtime_levers(p), Role.OWN) == [], (host, levers)
            assert set(environment.runtime_levers(p)) <= set(environment.snapshot({}))
            checked += 1
    assert checked >= 2 * len(FIXTURE_NAMES)


def test_every_variable_the_unit_and_the_bench_set_or_drop_is_declared():
    assert declared(unit_environment("chat"), Role.SET) == []
    assert declared(environment.OFFLINE, Role.SET) == []
    assert declared(environment.SYSTEMD_NOTIFY, Role.READ) == []
    assert declared(["VLLM_PLUGINS", "VLLM_SERVER_DEV_MODE", "HF_HUB_DISABLE_TELEMETRY", "PYTHONPATH"], Role.SET) == []
    assert [v.name for v in REGISTRY.values() if v.role is Role.REFUSED] == ["VLLM_CPU_KVCACHE_SPACE"]
    assert all(v.meaning for v in REGISTRY.values())


def test_edgectls_own_variables_read_with_defaults_and_choices():
    assert environment.read("EDGECTL_CONFIG_DIR", {}) == "/etc/edgectl"
    assert environment.read("EDGECTL_CONFIG_DIR", {"EDGECTL_CONFIG_DIR": ""}) == "/etc/edgectl"  # empty: unset
    assert environment.read("EDGECTL_CONFIG_DIR", {"EDGECTL_CONFIG_DIR": "/srv/e"}) == "/srv/e"
    assert environment.read("EDGECTL_ROPE_CAP", {}) == "0"  # unmodified vLLM unless the plan says so
    assert environment.read_int("EDGECTL_INT4_GROUP_SIZE", {"EDGECTL_INT4_GROUP_SIZE": "64"}) == 64
    with pytest.raises(ValueError, match="EDGECTL_INT4_KERNEL='tourch' is not valid: use one of torch, vllm"):
        environment.read("EDGECTL_INT4_KERNEL", {"EDGECTL_INT4_KERNEL": "tourch"})
    with pytest.raises(KeyError):
        environment.read("EDGECTL_NOT_DECLARED", {})
    with pytest.raises(KeyError):
        environment.read("HF_HUB_OFFLINE", {})  # a third party's: edgectl sets it, never reads it as its own


def test_an_override_of_a_planned_setting_is_refused():
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), shape("smollm2-135m"))
    assert environment.refused({"VLLM_CPU_KVCACHE_SPACE": ""}, p) == []  # vLLM ignores an empty value
    (line,) = environment.refused({"VLLM_CPU_KVCACHE_SPACE": "4"}, p)
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=4 is set and overrides the planned KV cache bytes")
    assert line.endswith(f"unset it (the plan sets {p.kv_cache_bytes} bytes)")
