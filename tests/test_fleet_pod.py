"""Inside a pod, the probe reads the pod's limits: what makes a plan made there fit the pod.

The fixture tests/fixtures/hosts/k8s-pod-cgroup2 is a container of a pod with limits memory 2Gi
and cpu 2 on a 15 GiB, 4-core Intel N100 node (its README says how the kubelet's settings become
these files). Each expected number is derived from the files, as in test_probe_fixtures.py.
"""

from __future__ import annotations

from pathlib import Path

from plan_helpers import SMOLLM2, make_plan, shape
from probe_helpers import GIB, KIB, MIB, copy_host, host

from edgectl.probe import DeviceClass, probe

POD = "k8s-pod-cgroup2"


def test_the_probe_reads_the_pods_limits_not_the_nodes():
    f = probe(host(POD))
    # flags avx2 fma avx_vnni, no avx512*: the AVX2 class; cpuid-flags agrees
    assert f.device_class is DeviceClass.X86_64_AVX2 and f.cpu.isa_disagreements == ()
    # /proc/self/cgroup "0::/", mountinfo: cgroup2 mounted at /sys/fs/cgroup with root "/"
    assert (f.memory.cgroup_version, f.memory.cgroup_path) == (2, "/")
    # memory.max 2147483648 = the pod's limits.memory 2Gi (memory.high max)
    assert f.memory.cgroup_limit_bytes == 2 * GIB
    # memory.current 40 MiB − inactive_file 4 MiB
    assert f.memory.cgroup_usage_bytes == 40 * MIB - 4 * MIB
    # 10 % of the 2 GiB limit is below the 512 MiB floor
    assert f.memory.reserve_bytes == 512 * MIB
    # min(MemAvailable 14200000 kB, 2 GiB − 36 MiB) − 512 MiB: the pod's limit binds, not the node's memory
    assert 14200000 * KIB > 2 * GIB
    assert f.memory.budget_bytes == 2 * GIB - 36 * MIB - 512 * MIB
    # cpu.max "200000 100000" = limits.cpu 2; cpuset.cpus.effective 0-3 (CPU manager policy none)
    assert f.topology.cpu_quota_cores == 2.0
    assert f.topology.usable_cpus == (0, 1, 2, 3)
    assert f.software.systemd_pid1 is False  # proc/1/comm "sleep": the pod's own process


def test_a_plan_made_in_the_pod_fits_the_pod():
    f = probe(host(POD))
    p = make_plan(f, shape(SMOLLM2))
    assert p.memory.limit_bytes <= f.memory.budget_bytes < 2 * GIB  # MemoryMax inside memory.max
    assert p.threads == 2  # the quota, though 4 CPUs are in the cpuset
    assert any(r.decision == "threads_quota" for r in p.reasons)


def test_without_the_pods_limits_the_same_node_plans_for_its_whole_memory(tmp_path: Path):
    # The same container with memory.max and cpu.max "max": the probe falls back to the node's
    # memory and CPUs, and the plan is bigger than the pod above could hold.
    tree = copy_host(POD, tmp_path)
    (tree / "sys/fs/cgroup/memory.max").write_text("max\n")
    (tree / "sys/fs/cgroup/cpu.max").write_text("max 100000\n")
    unlimited = probe(tree)
    assert unlimited.memory.budget_bytes > 10 * GIB
    in_pod = make_plan(probe(host(POD)), shape(SMOLLM2))
    on_node = make_plan(unlimited, shape(SMOLLM2))
    assert on_node.max_model_len > in_pod.max_model_len
    assert on_node.threads == 4 > in_pod.threads


def test_a_static_cpu_manager_gives_the_pod_its_own_cpus(tmp_path: Path):
    # The kubelet's static policy gives a Guaranteed pod exclusive CPUs: the cpuset and the
    # affinity then hold only those, and the plan runs there.
    tree = copy_host(POD, tmp_path)
    (tree / "sys/fs/cgroup/cpuset.cpus.effective").write_text("2-3\n")
    status = tree / "proc/self/status"
    status.write_text(status.read_text().replace("Cpus_allowed_list:\t0-3", "Cpus_allowed_list:\t2-3"))
    f = probe(tree)
    assert f.topology.usable_cpus == (2, 3)
    p = make_plan(f, shape(SMOLLM2))
    assert (p.cpus, p.threads) == ([2, 3], 2)
