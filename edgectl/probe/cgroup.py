"""Finding this process's cgroup for a controller, on cgroup v1, v2 or a hybrid of both.

/proc/self/cgroup names the cgroup per hierarchy ("4:memory:/a/b" on v1, "0::/a/b" on v2);
/proc/self/mountinfo says where each hierarchy is mounted and which cgroup its mount shows
as its root (a container without a cgroup namespace bind-mounts its own cgroup there). The
cgroup's directory is mount point + (cgroup path relative to the mount's root). Limits are
read at every level from there up to the mount point, because an ancestor's limit binds the
whole subtree (Documentation/admin-guide/cgroup-v2.rst, "Top-down constraint").
Without mountinfo (a hand-made tree) the usual layout is assumed: v2 at /sys/fs/cgroup (or
/sys/fs/cgroup/unified on a hybrid host), v1 at /sys/fs/cgroup/<controllers>.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from edgectl.probe.hostfs import HostFS, ReadFailed

CGROUP_FS = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Membership:
    hierarchy_id: int
    controllers: tuple[str, ...]  # empty for the v2 unified hierarchy
    path: str


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup this mount shows at its mount point
    mount_point: str
    version: int
    controllers: frozenset[str]  # v1 only


@dataclass(frozen=True)
class Place:
    """Where a controller's view of this process lives."""

    version: int
    path: str  # cgroup path as /proc/self/cgroup names it
    directory: str  # host path of that cgroup's directory
    mount_point: str  # walking up stops here
    assumed_layout: bool  # True when mountinfo was missing and the usual layout was assumed

    def levels(self) -> list[tuple[str, str]]:
        """(cgroup path, directory) from this cgroup up to the mount's root, own level first."""
        out = []
        path, directory = self.path, self.directory
        while True:
            out.append((path, directory))
            if directory == self.mount_point or len(directory) <= len(self.mount_point):
                break
            directory = posixpath.dirname(directory)
            path = posixpath.dirname(path) if path != "/" else "/"
        return out


def parse_proc_cgroup(text: str) -> list[Membership]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            raise ValueError(f"expected 'id:controllers:/path', got {line[:80]!r}")
        controllers = tuple(c for c in parts[1].split(",") if c)
        out.append(Membership(int(parts[0]), controllers, parts[2]))
    if not out:
        raise ValueError("no entries")
    return out


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (fs/proc_namespace.c)
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """cgroup mounts from /proc/self/mountinfo (Documentation/filesystems/proc.rst, 3.5)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            raise ValueError(f"short mountinfo line {line[:80]!r}")
        fstype, super_options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(Mount(root, mount_point, 2, frozenset()))
        elif fstype == "cgroup":
            mounts.append(Mount(root, mount_point, 1, frozenset(super_options.split(","))))
    return mounts


def _relative(path: str, mount_root: str) -> str | None:
    if mount_root == "/":
        return path.lstrip("/")
    if path == mount_root:
        return ""
    if path.startswith(mount_root.rstrip("/") + "/"):
        return path[len(mount_root.rstrip("/")) + 1:]
    return None


def locate(fs: HostFS, controller: str) -> Place | None:
    """This process's cgroup for ``controller``, or None when no hierarchy carries it.

    Raises :class:`ReadFailed` when /proc/self/cgroup cannot be read or is garbled.
    """
    try:
        members = parse_proc_cgroup(fs.read_text("/proc/self/cgroup"))
    except ValueError as exc:
        raise ReadFailed(f"{fs.describe('/proc/self/cgroup')} is garbled: {exc}") from None
    mounts: list[Mount] | None
    try:
        mounts = parse_mountinfo(fs.read_text("/proc/self/mountinfo"))
    except (ReadFailed, ValueError):
        mounts = None

    v1 = next((m for m in members if controller in m.controllers), None)
    if v1 is not None:
        candidates = [m for m in mounts or [] if m.version == 1 and controller in m.controllers]
        if mounts is None:
            names = [n for n in fs.listdir(CGROUP_FS) if controller in n.split(",")]
            candidates = [Mount("/", f"{CGROUP_FS}/{n}", 1, frozenset(n.split(","))) for n in names]
        return _place(fs, 1, v1.path, candidates, assumed=mounts is None)

    v2 = next((m for m in members if m.hierarchy_id == 0 and not m.controllers), None)
    if v2 is None:
        return None
    candidates = [m for m in mounts or [] if m.version == 2]
    if mounts is None:
        for top in (CGROUP_FS, f"{CGROUP_FS}/unified"):
            if fs.exists(f"{top}/cgroup.controllers"):
                candidates = [Mount("/", top, 2, frozenset())]
                break
    place = _place(fs, 2, v2.path, candidates, assumed=mounts is None)
    if place is None:
        return None
    # cgroup.controllers lists what is available to the cgroup (cgroup-v2.rst, "Core Interface
    # Files"); a v2 hierarchy without this controller anywhere up the tree does not carry it.
    for _, directory in place.levels():
        text = fs.read_optional(f"{directory}/cgroup.controllers")
        if text is not None and controller in text.split():
            return place
    return None


def _place(fs: HostFS, version: int, path: str, candidates: list[Mount], *, assumed: bool) -> Place | None:
    for m in candidates:
        rel = _relative(path, m.root)
        if rel is None:
            continue
        directory = posixpath.join(m.mount_point, rel) if rel else m.mount_point
        directory = posixpath.normpath(directory)
        if fs.is_dir(directory):
            return Place(version, path, directory, m.mount_point, assumed)
    # The cgroup is outside what the mount shows (a namespaced view printed as "/../.."): the
    # mount's own root is the closest cgroup this process can see.
    for m in candidates:
        if fs.is_dir(m.mount_point):
            return Place(version, m.root, m.mount_point, m.mount_point, assumed)
    return None
