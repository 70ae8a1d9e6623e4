"""The probe's parsers and rules, fed with the kernel's documented formats."""

from __future__ import annotations

import copy

import pytest
from probe_helpers import GIB, MIB, host

from edgectl.errors import EdgectlError
from edgectl.probe import AmxPermission, CpuFacts, DeviceClass, HostFacts, Isa, probe
from edgectl.probe import bandwidth as bw
from edgectl.probe.cgroup import Place, parse_mountinfo, parse_proc_cgroup
from edgectl.probe.cpu import device_class, parse_cpuinfo
from edgectl.probe.cpuid import decode_leaves, xcr0_needed
from edgectl.probe.formats import format_cpu_list, parse_cpu_list, parse_meminfo
from edgectl.probe.memory import reserve_bytes

# ---- formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, cpus", [
    ("0-3,8", (0, 1, 2, 3, 8)),
    ("0", (0,)),
    ("0-55,112-167\n", tuple(range(56)) + tuple(range(112, 168))),
    ("", ()),
    ("0-7:2", (0, 2, 4, 6)),
])
def test_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus
    if cpus:
        assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "0,,x", "-1", "99999999"])
def test_cpu_list_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


def test_meminfo_units_and_node_prefix():
    text = "MemTotal:       16370764 kB\nHugePages_Total:       0\n"
    assert parse_meminfo(text) == {"MemTotal": 16370764 * 1024, "HugePages_Total": 0}
    assert parse_meminfo("Node 1 MemTotal:       264157560 kB\n") == {"MemTotal": 264157560 * 1024}
    for bad in ("MemTotal 12 kB", "MemTotal: twelve kB", "MemTotal: 12 MB"):
        with pytest.raises(ValueError):
            parse_meminfo(bad)


def test_cpuinfo_blocks_and_garbage():
    info = parse_cpuinfo("processor\t: 0\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert [p["processor"] for p in info.processors] == ["0", "1"]
    with pytest.raises(ValueError):
        parse_cpuinfo("this is not cpuinfo\n")
    with pytest.raises(ValueError):
        parse_cpuinfo("vendor_id : GenuineIntel\n")  # no processor entries


# ---- cgroup ----------------------------------------------------------------------------------


def test_proc_cgroup_v1_and_v2_lines():
    members = parse_proc_cgroup("4:cpu,cpuacct:/user.slice\n0::/user.slice/session-3.scope\n")
    assert members[0].controllers == ("cpu", "cpuacct") and members[0].path == "/user.slice"
    assert members[1].hierarchy_id == 0 and members[1].controllers == ()
    with pytest.raises(ValueError):
        parse_proc_cgroup("garbage\n")


def test_mountinfo_cgroup_mounts_with_escapes_and_roots():
    text = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:14 - cgroup cgroup rw,cpu,cpuacct\n"
        "31 25 0:28 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "35 24 0:30 / /mnt/with\\040space rw - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    mounts = parse_mountinfo(text)
    assert [(m.version, m.mount_point) for m in mounts] == [
        (1, "/sys/fs/cgroup/cpu,cpuacct"), (1, "/sys/fs/cgroup/memory"), (2, "/mnt/with space")]
    assert {"cpu", "cpuacct"} <= mounts[0].controllers
    assert mounts[1].root == "/docker/abc"


def test_place_levels_walk_up_to_the_mount():
    p = Place(2, "/a/b", "/sys/fs/cgroup/a/b", "/sys/fs/cgroup", False)
    assert p.levels() == [("/a/b", "/sys/fs/cgroup/a/b"), ("/a", "/sys/fs/cgroup/a"), ("/", "/sys/fs/cgroup")]


def test_container_v1_without_namespace_maps_its_own_cgroup_to_the_mount(tmp_path):
    """Docker on v1 without a cgroup namespace: /proc/self/cgroup names /docker/<id>, and the
    memory mount shows that very cgroup as its root (mountinfo field 4)."""
    root = tmp_path / "t"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("5:memory:/docker/abc\n")
    (root / "proc/self/mountinfo").write_text(
        "31 25 0:28 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n")
    mem = root / "sys/fs/cgroup/memory"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("2147483648\n")
    (mem / "memory.usage_in_bytes").write_text("1073741824\n")
    (mem / "memory.stat").write_text("total_inactive_file 268435456\n")
    (root / "proc/meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 6291456 kB\nSwapTotal: 0 kB\n")
    f = probe(root)
    assert (f.memory.cgroup_version, f.memory.cgroup_path) == (1, "/docker/abc")
    assert f.memory.cgroup_limit_bytes == 2 * GIB
    # 2 GiB − (1 GiB − 256 MiB) − 512 MiB (10 % of 2 GiB is below the floor)
    assert f.memory.budget_bytes == 2 * GIB - (GIB - 256 * MIB) - 512 * MIB


# ---- cpuid decoding --------------------------------------------------------------------------


def test_cpuid_bits_decode_to_kernel_names():
    leaves = {
        "1": [0, 0, (1 << 12) | (1 << 28), 0],  # ECX: FMA, AVX
        "7.0": [1, (1 << 5) | (1 << 16) | (1 << 30), 1 << 11, (1 << 22) | (1 << 24)],
        "7.1": [1 << 5, 0, 0, 0],  # EAX bit 5: AVX512_BF16
    }
    assert decode_leaves(leaves) == {"fma", "avx", "avx2", "avx512f", "avx512bw", "avx512_vnni",
                                     "amx_bf16", "amx_tile", "avx512_bf16"}
    assert decode_leaves({"0": [0, 0, 0, 0]}) == frozenset()


def test_xcr0_requirements():
    assert xcr0_needed("avx2") == 0b110
    assert xcr0_needed("avx512f") == 0b11100110
    assert xcr0_needed("amx_tile") == (1 << 17) | (1 << 18)


# ---- rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("limit, reserve", [
    (1 * GIB, 512 * MIB),  # 10 % = 102 MiB: the floor
    (10 * GIB, GIB),  # 10 %
    (100 * GIB, 4 * GIB),  # 10 % = 10 GiB: the cap
])
def test_reserve_rule(limit, reserve):
    assert reserve_bytes(limit) == reserve


def _cpu(arch="x86_64", permission=AmxPermission.UNSUPPORTED, **isa):
    return CpuFacts(arch=arch, vendor=None, model_name=None, flags=(), isa=Isa(**isa),
                    isa_disagreements=(), amx_permission=permission)


AVX512 = dict(avx2=True, fma=True, avx512f=True, avx512bw=True, avx512vl=True, avx512dq=True)


@pytest.mark.parametrize("cpu, live, expected", [
    (_cpu(**AVX512, avx512_bf16=True, amx_tile=True, amx_bf16=True, permission=AmxPermission.GRANTED),
     True, DeviceClass.X86_64_AMX),
    # the kernel refused the tile-data permission: AMX kernels cannot run
    (_cpu(**AVX512, avx512_bf16=True, amx_tile=True, amx_bf16=True, permission=AmxPermission.DENIED),
     True, DeviceClass.X86_64_AVX512_BF16),
    # live host where the permission could not be checked: not counted as granted
    (_cpu(**AVX512, avx512_bf16=True, amx_tile=True, amx_bf16=True, permission=AmxPermission.NOT_CHECKED),
     True, DeviceClass.X86_64_AVX512_BF16),
    # a captured tree cannot be asked: its files decide
    (_cpu(**AVX512, avx512_bf16=True, amx_tile=True, amx_bf16=True, permission=AmxPermission.NOT_CHECKED),
     False, DeviceClass.X86_64_AMX),
    (_cpu(**AVX512), True, DeviceClass.X86_64_AVX512),
    # avx512 needs F+BW+VL+DQ: without DQ it is an AVX2 box for vLLM and torch
    (_cpu(**{**AVX512, "avx512dq": False}), True, DeviceClass.X86_64_AVX2),
    (_cpu(avx2=True, fma=False), True, DeviceClass.GENERIC),
    (_cpu(arch="aarch64", asimd=True, sve=True), True, DeviceClass.AARCH64_SVE),
    (_cpu(arch="aarch64", asimd=True), True, DeviceClass.AARCH64_NEON),
    (_cpu(arch=None), True, DeviceClass.GENERIC),
])
def test_device_class_rules(cpu, live, expected):
    assert device_class(cpu, live=live) is expected


# ---- JSON contract ---------------------------------------------------------------------------


def test_json_keys_are_the_published_schema():
    d = probe(host("container-cgroup2")).to_dict()
    assert list(d) == ["schema", "root", "device_class", "cpu", "topology", "memory", "bandwidth_gbps",
                       "software", "unknown", "notes"]
    assert d["schema"] == "edgectl.probe/1"
    assert list(d["cpu"]) == ["arch", "vendor", "model_name", "flags", "isa", "isa_disagreements",
                              "amx_permission", "signature"]
    assert list(d["cpu"]["isa"]) == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                                     "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
                                     "asimd", "sve"]
    assert list(d["topology"]) == ["logical_cpus", "physical_cores", "sockets", "usable_cpus",
                                   "cpu_quota_cores", "numa_nodes"]
    assert list(d["topology"]["numa_nodes"][0]) == ["id", "cpus", "memory_total_bytes"]
    assert list(d["memory"]) == ["total_bytes", "available_bytes", "swap_total_bytes", "cgroup_version",
                                 "cgroup_path", "cgroup_limit_bytes", "cgroup_usage_bytes",
                                 "reserve_bytes", "budget_bytes"]
    assert list(d["software"]) == ["python", "torch", "vllm", "systemd_pid1", "kernel"]
    assert d["cpu"]["flags"] == sorted(d["cpu"]["flags"])


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="edgectl.probe/0"), "schema"),
    (lambda d: d["memory"].pop("budget_bytes"), "memory.budget_bytes: missing"),
    (lambda d: d["memory"].update(total_bytes=True), "memory.total_bytes"),
    (lambda d: d["memory"].update(total_bytes=-1), "memory.total_bytes"),
    (lambda d: d["topology"].update(usable_cpus=[0, "1"]), "topology.usable_cpus[1]"),
    (lambda d: d.update(device_class="x86_64-sse"), "device_class"),
    (lambda d: d["cpu"]["isa"].update(avx2="yes"), "cpu.isa.avx2"),
    (lambda d: d["cpu"].update(amx_permission="maybe"), "cpu.amx_permission"),
    (lambda d: d.update(bandwidth_gbps="fast"), "bandwidth_gbps"),
    (lambda d: d["cpu"]["isa"].pop("sve"), "cpu.isa.sve: missing"),
    (lambda d: d["topology"].update(usable_cpus=[0, -1]), "topology.usable_cpus: expected a non-negative number, got -1"),
    (lambda d: d["software"].update(libc="glibc"), "software.libc: unknown field"),
])
def test_from_dict_names_the_bad_field(mutate, message):
    d = copy.deepcopy(probe(host("container-cgroup2")).to_dict())
    mutate(d)
    with pytest.raises(EdgectlError) as err:
        HostFacts.from_dict(d, source="box.json")
    assert err.value.message.startswith("box.json: ")
    assert message in err.value.message


# ---- bandwidth sizing --------------------------------------------------------------------------


def test_bandwidth_buffers_exceed_the_cache_within_the_budget():
    assert bw.buffer_total_bytes(llc_bytes=260 * MIB, budget_bytes=20 * GIB) == 520 * MIB
    assert bw.buffer_total_bytes(llc_bytes=8 * MIB, budget_bytes=None) == 256 * MIB
    assert bw.buffer_total_bytes(llc_bytes=2 * GIB, budget_bytes=None) == 1024 * MIB
    assert bw.buffer_total_bytes(llc_bytes=260 * MIB, budget_bytes=400 * MIB) == 100 * MIB
    with pytest.raises(bw.BandwidthUnavailable):
        bw.buffer_total_bytes(llc_bytes=None, budget_bytes=100 * MIB)


def test_bandwidth_copy_reports_what_it_measured():
    result = bw.measure([0], 8 * MIB, max_seconds=1.0, max_repetitions=3)
    assert result.threads == 1 and result.bytes_per_thread == 4 * MIB
    assert 1 <= result.repetitions <= 3
    assert result.gbps > 0
    assert "read + write" in result.describe()


def test_x86_signature_needs_all_three_numbers():
    from edgectl.probe.cpu import _x86_signature, parse_cpuinfo
    whole = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nstepping\t: 8\n"
    assert _x86_signature(parse_cpuinfo(whole)) == "family 6 model 143 stepping 8"
    # a hypervisor that hides the stepping (or writes something else) gives no signature, not a guess
    assert _x86_signature(parse_cpuinfo(whole.replace("stepping\t: 8", "stepping\t: unknown"))) is None
    assert _x86_signature(parse_cpuinfo(whole.replace("stepping\t: 8\n", ""))) is None
