"""The probe on each fixture tree gives the facts derived by hand from that tree's files.

Every expected number below is worked out from the lines of the fixture's files quoted in the
comment next to it (the trees are in tests/fixtures/hosts/, the built ones written by
build_synthetic.py); the reserve rule is the one the probe states:
reserve = min(4 GiB, max(512 MiB, 10 % of min(MemTotal, cgroup limit))),
budget = min(MemAvailable, cgroup limit − cgroup usage) − reserve, usage = usage − inactive file.
"""

from __future__ import annotations

import pytest
from probe_helpers import FIXTURE_NAMES, GIB, KIB, MIB, copy_host, host

from edgectl.probe import AmxPermission, DeviceClass, HostFacts, probe

# ---- the real capture of this machine ----------------------------------------------------------


def test_kvm_xeon_avx512_capture():
    f = probe(host("kvm-xeon-avx512-2c"))
    # proc/cpuinfo flags: avx512f avx512dq avx512bw avx512vl present, no avx512_bf16, no amx_*
    assert f.device_class is DeviceClass.X86_64_AVX512
    assert f.cpu.vendor == "GenuineIntel"
    # the guest's model name says no generation; cpu family 6, model 207, stepping 2 do
    assert (f.cpu.model_name, f.cpu.signature) == ("Intel(R) Xeon(R) Processor", "family 6 model 207 stepping 2")
    assert f.cpu.isa.avx512_vnni and not f.cpu.isa.avx512_bf16 and not f.cpu.isa.amx_tile
    # cpuid-flags (captured from the real cpuid) lists the same AVX-512 set: no disagreement
    assert f.cpu.isa_disagreements == ()
    assert f.cpu.amx_permission is AmxPermission.UNSUPPORTED
    # sys/devices/system/cpu/online "0-1"; core_cpus_list "0" and "1"; one physical_package_id
    assert (f.topology.logical_cpus, f.topology.physical_cores, f.topology.sockets) == (2, 2, 1)
    # Cpus_allowed_list 0-1 ∩ cpuset.effective_cpus 0-1 (cpuset cgroup "/") ∩ online 0-1
    assert f.topology.usable_cpus == (0, 1)
    # cpu cgroup "/": cpu.cfs_quota_us -1
    assert f.topology.cpu_quota_cores is None
    m = f.memory
    assert m.cgroup_version == 1
    assert m.cgroup_path == "/process_api/27e8dac9100a391de4d80143b2ab8df2"
    # memory.limit_in_bytes 9223372036854771712 at every level: no limit
    assert m.cgroup_limit_bytes is None
    # memory.usage_in_bytes 36171776 − total_inactive_file 7958528
    assert m.cgroup_usage_bytes == 36171776 - 7958528
    # MemTotal 24684092 kB → reserve 10 % = 2527651020 (between the 512 MiB floor and the 4 GiB cap)
    assert m.total_bytes == 24684092 * KIB
    assert m.reserve_bytes == 2527651020
    # MemAvailable 24119988 kB − reserve
    assert m.budget_bytes == 24119988 * KIB - 2527651020
    assert m.swap_total_bytes == 0
    # edgectl-software.json, proc/sys/kernel/osrelease, proc/1/comm "python" (no systemd)
    assert (f.software.python, f.software.torch, f.software.vllm) == ("3.11.2", "2.13.0+cpu", "0.32.0")
    assert f.software.kernel == "6.18.44-fc-v657"
    assert f.software.systemd_pid1 is False
    # node0/meminfo says 9922772 kB: reported as read, with a note about the mismatch
    assert f.topology.numa_nodes[0].memory_total_bytes == 9922772 * KIB
    assert any("NUMA" in n and "MemTotal" in n for n in f.notes)
    assert f.unknown == ()


def test_kvm_epyc_avx2():
    f = probe(host("kvm-epyc-avx2-2c"))
    # flags have avx2 and fma, no avx512*: the development box of the facts files
    assert f.device_class is DeviceClass.X86_64_AVX2
    assert (f.cpu.vendor, f.cpu.model_name) == ("AuthenticAMD", "AMD EPYC 7B13")
    assert not f.cpu.isa.avx512f
    assert f.cpu.isa_disagreements == ()  # cpuid-flags: avx avx2 fma xsave, xcr0=0x7
    assert f.topology.usable_cpus == (0, 1)
    assert f.topology.cpu_quota_cores is None
    # memory files are the capture's: same budget arithmetic as above
    assert f.memory.budget_bytes == 24119988 * KIB - 2527651020


# ---- built trees ---------------------------------------------------------------------------


def test_xeon_spr_amx_two_sockets():
    f = probe(host("xeon-spr-amx-2s"))
    # amx_tile amx_int8 amx_bf16 in cpuinfo and cpuid-flags, xcr0=0x602e7 has bits 17-18 (tile state)
    assert f.device_class is DeviceClass.X86_64_AMX
    assert f.cpu.isa.amx_tile and f.cpu.isa.amx_bf16 and f.cpu.isa.amx_int8 and f.cpu.isa.avx512_bf16
    # a tree cannot be asked for the permission: not-checked, and a note says the class assumed it
    assert f.cpu.amx_permission is AmxPermission.NOT_CHECKED
    assert any("AMX permission not checked" in n for n in f.notes)
    assert f.cpu.isa_disagreements == ()
    # online 0-223; core_cpus_list of cpu c is "c%112,c%112+112": 112 cores; packages 0 and 1
    assert (f.topology.logical_cpus, f.topology.physical_cores, f.topology.sockets) == (224, 112, 2)
    assert f.topology.usable_cpus == tuple(range(224))
    assert f.topology.cpu_quota_cores is None  # cpu.max "max 100000" at every level
    nodes = f.topology.numa_nodes
    assert [n.id for n in nodes] == [0, 1]
    assert nodes[0].cpus == tuple(range(0, 56)) + tuple(range(112, 168))
    assert nodes[1].cpus == tuple(range(56, 112)) + tuple(range(168, 224))
    assert [n.memory_total_bytes for n in nodes] == [263855676 * KIB, 264157560 * KIB]
    m = f.memory
    assert (m.cgroup_version, m.cgroup_limit_bytes) == (2, None)  # memory.max "max" everywhere
    # session scope: memory.current 1610612736 − inactive_file 500000000
    assert m.cgroup_usage_bytes == 1610612736 - 500000000
    # 10 % of MemTotal 528013236 kB is ~50 GiB: the 4 GiB cap applies
    assert m.reserve_bytes == 4 * GIB
    assert m.budget_bytes == 515000000 * KIB - 4 * GIB
    # no edgectl-software.json: versions unknown, and said so
    unknown = {u.fact for u in f.unknown}
    assert {"software.python", "software.torch", "software.vllm"} <= unknown
    assert f.software.python is None and f.software.systemd_pid1 is True


def test_arm64_board():
    f = probe(host("arm64-board"))
    # Features: ... asimd ... (no sve); /proc/sys/kernel/arch "aarch64"
    assert f.device_class is DeviceClass.AARCH64_NEON
    assert f.cpu.arch == "aarch64"
    assert f.cpu.isa.asimd and not f.cpu.isa.sve
    # CPU implementer 0x41 part 0xd0b; the board line "Model : Raspberry Pi 5 Model B Rev 1.0"
    assert f.cpu.vendor == "ARM"
    assert f.cpu.model_name == "Cortex-A76 (Raspberry Pi 5 Model B Rev 1.0)"
    assert f.cpu.signature is None  # an Arm CPU's part is in its name; x86's family/model/stepping only
    assert f.cpu.amx_permission is AmxPermission.UNSUPPORTED
    assert (f.topology.logical_cpus, f.topology.physical_cores, f.topology.sockets) == (4, 4, 1)
    assert f.topology.usable_cpus == (0, 1, 2, 3)
    # no sys/devices/system/node: one node with all CPUs and MemTotal, and a note
    assert len(f.topology.numa_nodes) == 1
    assert f.topology.numa_nodes[0].cpus == (0, 1, 2, 3)
    assert f.topology.numa_nodes[0].memory_total_bytes == 8245360 * KIB
    assert any("kernel without NUMA" in n for n in f.notes)
    # root cgroup.controllers "cpuset cpu io pids": no memory controller, so no limit
    assert f.memory.cgroup_version is None and f.memory.cgroup_limit_bytes is None
    # 10 % of MemTotal 8245360 kB = 844324864 B (above the 512 MiB floor)
    assert f.memory.reserve_bytes == 844324864
    assert f.memory.budget_bytes == 7421800 * KIB - 844324864
    assert f.memory.swap_total_bytes == 524272 * KIB
    # edgectl-software.json: torch and vllm null = not installed, which is known, not unknown
    assert f.software.torch is None and not f.is_unknown("software.torch")


def test_container_cgroup2():
    f = probe(host("container-cgroup2"))
    # Zen 4 flags: avx512f/bw/vl/dq and avx512_bf16, no amx
    assert f.device_class is DeviceClass.X86_64_AVX512_BF16
    # Cpus_allowed_list 2-3, cpuset.cpus.effective 2-3, online 0-7
    assert f.topology.usable_cpus == (2, 3)
    # cpu.max "150000 100000"
    assert f.topology.cpu_quota_cores == 1.5
    # host seen through the container: 8 CPUs, siblings c and c+4 → 4 cores
    assert (f.topology.logical_cpus, f.topology.physical_cores) == (8, 4)
    m = f.memory
    assert (m.cgroup_version, m.cgroup_path) == (2, "/")
    assert m.cgroup_limit_bytes == 4 * GIB  # memory.max 4294967296, memory.high max
    # memory.current 1288490188 − inactive_file 419430400 (active_file 300 MiB stays counted)
    assert m.cgroup_usage_bytes == 1288490188 - 419430400
    # 10 % of the 4 GiB limit is 409.6 MiB: the 512 MiB floor applies
    assert m.reserve_bytes == 512 * MIB
    # the cgroup leaves 4 GiB − 828.8 MiB, far less than MemAvailable 29360128 kB
    assert m.budget_bytes == 4 * GIB - (1288490188 - 419430400) - 512 * MIB
    assert f.software.systemd_pid1 is False  # proc/1/comm "sh"
    # no cpuid-flags in this tree: no cross-check, and a note says so
    assert any("cpuid-flags" in n for n in f.notes)


def test_host_cgroup1_ancestor_limit():
    f = probe(host("host-cgroup1"))
    # Cascade Lake: avx512f/bw/vl/dq + avx512_vnni, no avx512_bf16
    assert f.device_class is DeviceClass.X86_64_AVX512
    # Cpus_allowed_list 0-11 (taskset) ∩ cpuset.cpus 0-23 ∩ online 0-23
    assert f.topology.usable_cpus == tuple(range(12))
    # thread_siblings_list (a 4.15 kernel has no core_cpus_list): c and c+12 → 12 cores
    assert (f.topology.logical_cpus, f.topology.physical_cores, f.topology.sockets) == (24, 12, 1)
    # cpu,cpuacct: user-1000.slice -1, user.slice 400000/100000 → 4 cores from the ancestor
    assert f.topology.cpu_quota_cores == 4.0
    m = f.memory
    # session scope and user-1000.slice unlimited; user.slice memory.limit_in_bytes 6442450944
    assert (m.cgroup_version, m.cgroup_path, m.cgroup_limit_bytes) == (1, "/user.slice", 6 * GIB)
    # user.slice usage_in_bytes 2147483648 − total_inactive_file 536870912
    assert m.cgroup_usage_bytes == 2 * GIB - 512 * MIB
    # 10 % of the 6 GiB limit = 644245094 B
    assert m.reserve_bytes == 644245094
    assert m.budget_bytes == 6 * GIB - (2 * GIB - 512 * MIB) - 644245094
    assert any("ancestor cgroup, /user.slice" in n for n in f.notes)
    # no /proc/sys/kernel/arch on 4.15: the cpuinfo format ("lm" flag) says x86_64
    assert f.cpu.arch == "x86_64"
    assert (f.software.torch, f.software.vllm) == ("2.13.0+cpu", None)


def test_vm_with_avx512_the_kernel_did_not_enable():
    f = probe(host("vm-avx512-disabled"))
    # cpuinfo: avx2 fma, no avx512*; cpuid-flags: avx512f dq cd bw vl, xcr0=0x7
    assert f.device_class is DeviceClass.X86_64_AVX2
    assert not (f.cpu.isa.avx512f or f.cpu.isa.avx512bw or f.cpu.isa.avx512vl or f.cpu.isa.avx512dq)
    by_feature = {d.feature: d for d in f.cpu.isa_disagreements}
    assert set(by_feature) == {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    for d in by_feature.values():
        assert (d.kernel, d.cpuid) == (False, True)
        assert "XCR0=0x7" in d.note and "SIGILL" in d.note
    # no limits; 10 % of MemTotal 16370764 kB = 1676366233 B
    assert f.memory.cgroup_limit_bytes is None
    assert f.memory.budget_bytes == 15200000 * KIB - 1676366233
    # no mountinfo in this tree: the usual layout was assumed, and said so
    assert any("mountinfo" in n for n in f.notes)


def test_without_the_stand_in_the_kernel_alone_decides(tmp_path):
    tree = copy_host("vm-avx512-disabled", tmp_path)
    (tree / "cpuid-flags").unlink()
    f = probe(tree)
    assert f.device_class is DeviceClass.X86_64_AVX2
    assert f.cpu.isa_disagreements == ()


def test_kernel_flag_with_xcr0_state_off_is_not_usable(tmp_path):
    # Both cpuinfo and cpuid list avx512f, but XCR0 lacks the ZMM state: not usable.
    tree = copy_host("host-cgroup1", tmp_path)
    (tree / "cpuid-flags").write_text("avx avx2 fma xsave avx512f avx512dq avx512cd avx512bw avx512vl "
                                      "avx512_vnni\nxcr0=0x7\n")
    f = probe(tree)
    assert f.device_class is DeviceClass.X86_64_AVX2
    assert {d.feature for d in f.cpu.isa_disagreements} >= {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_amx_without_bf16_tile_is_not_amx_class(tmp_path):
    # AMX class needs amx_tile AND amx_bf16: drop amx_bf16 from every cpuinfo line and the stand-in
    tree = copy_host("xeon-spr-amx-2s", tmp_path)
    for name in ("proc/cpuinfo", "cpuid-flags"):
        p = tree / name
        p.write_text(p.read_text().replace(" amx_bf16", ""))
    f = probe(tree)
    assert f.device_class is DeviceClass.X86_64_AVX512_BF16


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_facts_round_trip_through_json(name):
    f = probe(host(name))
    assert HostFacts.from_dict(f.to_dict()) == f


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_no_silent_zero(name):
    """A fact that is None is either legitimately absent (no limit, no quota, not installed) or
    listed in `unknown`: never a 0 standing in for 'could not read'."""
    d = probe(host(name)).to_dict()
    for section in ("memory", "topology"):
        for key, value in d[section].items():
            if value == 0 and key not in ("swap_total_bytes", "budget_bytes"):
                pytest.fail(f"{name}: {section}.{key} is 0")
    assert d["topology"]["logical_cpus"] and d["memory"]["total_bytes"]
