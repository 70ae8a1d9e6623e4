"""The inside of tests/test_probe_cgroup2_mounted.py: run as root in a private mount namespace
(``unshare --mount --propagation private``), it mounts a cgroup2 filesystem at ROOT/sys/fs/cgroup,
makes a cgroup there, moves itself into it, and prints as JSON what edgectl's cgroup reader
(edgectl/probe/cgroup.py, edgectl/probe/memory.py) makes of the kernel's own files.

argv: ROOT, the cgroup's name, ``mountinfo`` or ``no-mountinfo`` (the reader's two ways to find the
hierarchy), and the memory.max in bytes to set when the hierarchy carries the memory controller.

The probe reads through a HostFS rooted at ROOT: ROOT/sys/fs/cgroup is the kernel's tree, and
ROOT/proc/self/cgroup holds the kernel's own ``0::`` line for this process, alone. That line is the
one thing chosen: on a cgroup v1 or hybrid host the kernel also prints a line per v1 hierarchy, and
the reader takes a controller bound to v1 from there (cgroup.py, ``locate``); a host without v1
hierarchies prints the ``0::`` line only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgectl.probe import cgroup
from edgectl.probe.hostfs import HostFS, Unknowns
from edgectl.probe.memory import probe_memory

CONTROLLERS = ("memory", "cpu", "cpuset")  # what the probe reads (memory.py, topology.py)


def _v2_path(proc_self_cgroup: str) -> str:
    return next(line[3:] for line in proc_self_cgroup.splitlines() if line.startswith("0::"))


def _fake_root_files(root: Path, mount_point: Path, with_mountinfo: bool) -> str:
    """ROOT/proc/self/{cgroup,mountinfo} and ROOT/proc/meminfo from this process's own; the ``0::`` line."""
    line = "0::" + _v2_path(Path("/proc/self/cgroup").read_text())
    proc_self = root / "proc" / "self"
    proc_self.mkdir(parents=True, exist_ok=True)
    (proc_self / "cgroup").write_text(line + "\n")
    (root / "proc" / "meminfo").write_text(Path("/proc/meminfo").read_text())
    if with_mountinfo:
        # The kernel's line for the mount made here, its mount point as the re-rooted reader sees it.
        ours = [m for m in Path("/proc/self/mountinfo").read_text().splitlines()
                if f" {mount_point} " in m and " - cgroup2 " in m]
        (proc_self / "mountinfo").write_text(
            "".join(m.replace(f" {mount_point} ", f" {cgroup.CGROUP_FS} ", 1) + "\n" for m in ours))
    return line


def main(root: Path, name: str, with_mountinfo: bool, limit_bytes: int) -> dict[str, object]:
    mount_point = root / cgroup.CGROUP_FS.lstrip("/")
    mount_point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "cgroup2", "none", str(mount_point)], check=True)
    controllers = (mount_point / "cgroup.controllers").read_text().split()
    home = mount_point / _v2_path(Path("/proc/self/cgroup").read_text()).lstrip("/")
    if not home.is_dir():  # outside what this mount shows: the hierarchy's root takes it back
        home = mount_point
    group = mount_point / name
    if "memory" in controllers:
        try:  # refused where the hierarchy's root holds processes of its own (a cgroup namespace's root)
            (mount_point / "cgroup.subtree_control").write_text("+memory")
        except OSError:
            pass
    group.mkdir()
    try:
        group_controllers = (group / "cgroup.controllers").read_text().split()
        if "memory" in group_controllers:
            (group / "memory.max").write_text(str(limit_bytes))
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            kernel_line = _fake_root_files(root, mount_point, with_mountinfo)
            fs = HostFS(root)
            located = {c: cgroup.locate(fs, c) for c in CONTROLLERS}
            unknown, notes = Unknowns(), []
            memory, _ = probe_memory(fs, unknown, notes)
        finally:
            (home / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        group.rmdir()
    return {"controllers": controllers, "group_controllers": group_controllers, "kernel_line": kernel_line,
            "located": {c: None if p is None else {"version": p.version, "directory": p.directory,
                                                   "mount_point": p.mount_point, "assumed_layout": p.assumed_layout}
                        for c, p in located.items()},
            "memory": {"cgroup_version": memory.cgroup_version, "cgroup_path": memory.cgroup_path,
                       "cgroup_limit_bytes": memory.cgroup_limit_bytes},
            "notes": notes, "unknown": unknown.entries}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "mountinfo", int(sys.argv[4]))))
