"""edgectl's cgroup v2 reader against a real cgroup2 filesystem the test mounts, not a captured tree.

As root, in a private mount namespace, tests/cgroup2_inside.py mounts cgroup2, makes a cgroup in it,
moves itself in, and reads it with the probe's own code (edgectl/probe/cgroup.py, memory.py): the
kernel's /proc/self/cgroup ``0::`` line, its mountinfo line (or none: the usual layout assumed), and
the kernel's cgroup.controllers and memory.max. The cgroup is removed again; the mount ends with the
namespace.

The limit of a cgroup v1 host (the development and CI machines: memory, cpu and cpuset are bound to
v1 hierarchies, the unified one mounted beside them carries no controller): a controller is in one
hierarchy at a time (Documentation/admin-guide/cgroup-v2.rst, "Mounting"), so the mounted v2 tree
has an empty cgroup.controllers and no memory.max, cpu.max or cpuset.cpus.effective, and writing
"+memory" to its cgroup.subtree_control fails. There the test checks what such a host has: the
kernel's v2 membership is read, and a v2 hierarchy without the memory, cpu and cpuset controllers
gives no limit from them (cgroup.py reads cgroup.controllers at every level). Where the hierarchy
does carry memory (a cgroup v2 host), the test also sets memory.max on its cgroup and checks the
probe reads it back as the limit. memory.max, cpu.max and cpuset.cpus.effective values on this
machine class stay covered by the captured trees (tests/fixtures/hosts/container-cgroup2,
k8s-pod-cgroup2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

INSIDE = Path(__file__).resolve().parent / "cgroup2_inside.py"
LIMIT_BYTES = 256 * 2**20

pytestmark = pytest.mark.host


def _inside(tmp_path: Path, how: str) -> dict:
    if os.geteuid() != 0:
        pytest.skip("mounting cgroup2 and making a cgroup need root")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux)")
    name = f"edgectl-test-{os.getpid()}-{how}"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "--",
                           sys.executable, str(INSIDE), str(tmp_path / "root"), name, how, str(LIMIT_BYTES)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("how", ["mountinfo", "no-mountinfo"])
def test_a_mounted_cgroup2_hierarchy_is_read_from_the_kernel(tmp_path, how):
    got = _inside(tmp_path, how)
    name = f"edgectl-test-{os.getpid()}-{how}"
    assert got["kernel_line"] == f"0::/{name}"  # the kernel put the process in the test's cgroup
    for controller in ("memory", "cpu", "cpuset"):
        place = got["located"][controller]
        if controller in got["controllers"]:
            assert place == {"version": 2, "directory": f"/sys/fs/cgroup/{name}", "mount_point": "/sys/fs/cgroup",
                             "assumed_layout": how == "no-mountinfo"}, controller
        else:  # not in cgroup.controllers at any level: this hierarchy gives no limit of it
            assert place is None, controller
    if "memory" in got["group_controllers"]:  # the test's cgroup has a memory.max, set to LIMIT_BYTES
        assert got["memory"] == {"cgroup_version": 2, "cgroup_path": f"/{name}", "cgroup_limit_bytes": LIMIT_BYTES}
    elif "memory" in got["controllers"]:  # carried, but not given to the test's cgroup
        assert got["memory"]["cgroup_version"] == 2
    else:
        assert got["memory"] == {"cgroup_version": None, "cgroup_path": None, "cgroup_limit_bytes": None}
        assert "no memory cgroup controller applies to this process: no cgroup memory limit" in got["notes"]
