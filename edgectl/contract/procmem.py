"""Memory of a process tree or a cgroup, as PSS, from ``/proc/PID/smaps_rollup``.

PSS (proportional set size) charges a shared page to each process that maps it in
proportion, so summing PSS over a tree counts shared libraries once and a file mapped by
one process fully. RSS would count an mmap'd checkpoint as if it were resident model
memory, and reading the parent alone misses the worker child that holds the model: two
measurement errors this project has already retracted once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KiB = 1024


@dataclass(frozen=True)
class ProcMem:
    pid: int
    name: str
    pss_bytes: int
    pss_anon_bytes: int
    pss_file_bytes: int
    pss_shmem_bytes: int
    rss_bytes: int
    anon_huge_bytes: int = 0  # AnonHugePages: anonymous memory on transparent huge pages

    def to_dict(self) -> dict[str, int | str]:
        return {"pid": self.pid, "name": self.name, "pss_bytes": self.pss_bytes,
                "pss_anon_bytes": self.pss_anon_bytes, "pss_file_bytes": self.pss_file_bytes,
                "pss_shmem_bytes": self.pss_shmem_bytes, "rss_bytes": self.rss_bytes,
                "anon_huge_bytes": self.anon_huge_bytes}


@dataclass(frozen=True)
class TreeMem:
    processes: tuple[ProcMem, ...]
    unreadable: tuple[int, ...]  # pids that vanished or could not be read

    @property
    def pss_bytes(self) -> int:
        return sum(p.pss_bytes for p in self.processes)

    @property
    def pss_anon_bytes(self) -> int:
        return sum(p.pss_anon_bytes for p in self.processes)

    @property
    def pss_file_bytes(self) -> int:
        return sum(p.pss_file_bytes for p in self.processes)

    @property
    def anon_huge_bytes(self) -> int:
        return sum(p.anon_huge_bytes for p in self.processes)

    def to_dict(self) -> dict[str, Any]:
        return {"pss_bytes": self.pss_bytes, "pss_anon_bytes": self.pss_anon_bytes,
                "pss_file_bytes": self.pss_file_bytes, "processes": [p.to_dict() for p in self.processes],
                "unreadable_pids": list(self.unreadable)}


def read_proc_mem(pid: int, proc: Path = Path("/proc")) -> ProcMem | None:
    """One process's PSS split, or None if it is gone or unreadable."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
        name = (proc / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith(":") and parts[2] == "kB":
            fields[parts[0][:-1]] = int(parts[1]) * KiB
    if "Pss" not in fields:
        return None  # a kernel thread or a zombie has no mappings
    return ProcMem(pid, name, fields["Pss"], fields.get("Pss_Anon", 0), fields.get("Pss_File", 0),
                   fields.get("Pss_Shmem", 0), fields.get("Rss", 0), fields.get("AnonHugePages", 0))


def children_map(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """ppid → [pid] for every process, from /proc/PID/stat."""
    out: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields after the last ')' are fixed
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) >= 2:
            out.setdefault(int(rest[1]), []).append(int(entry.name))
    return out


def tree_pids(root_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """``root_pid`` and all its descendants."""
    kids = children_map(proc)
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def mem_of_pids(pids: list[int], proc: Path = Path("/proc")) -> TreeMem:
    got, missing = [], []
    for pid in pids:
        m = read_proc_mem(pid, proc)
        (got.append(m) if m is not None else missing.append(pid))
    return TreeMem(tuple(got), tuple(missing))


def tree_mem(root_pid: int, proc: Path = Path("/proc")) -> TreeMem:
    """PSS of a process and every descendant (the model lives in a child in vLLM's layout)."""
    return mem_of_pids(tree_pids(root_pid, proc), proc)


def cgroup_pids(cgroup: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[int]:
    """Every pid in a cgroup and its sub-cgroups (systemd's ``ControlGroup`` path)."""
    roots = [cgroup_root / cgroup.lstrip("/")]
    unified = cgroup_root / "unified" / cgroup.lstrip("/")  # hybrid hierarchy: systemd's tree is here
    if not roots[0].is_dir() and unified.is_dir():
        roots = [unified]
    pids: list[int] = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            if "cgroup.procs" in files:
                try:
                    pids += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
                except OSError:
                    continue
    return sorted(set(pids))


def cgroup_mem(cgroup: str, cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> TreeMem:
    return mem_of_pids(cgroup_pids(cgroup, cgroup_root), proc)
