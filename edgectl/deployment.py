"""Where a deployment lives and what it is doing: its files, its unit, its port, its memory.

Shared by ``deploy``, ``status``, ``serve`` and ``logs`` (none of them imports another). The
worker is reached with the one client, ``edgectl/client.py``.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgectl.contract import environment
from edgectl.contract.plan import Plan
from edgectl.contract.procmem import TreeMem, cgroup_mem
from edgectl.errors import EdgectlError
from edgectl.systemd import UnitState
from edgectl.units import unit_name


@dataclass(frozen=True)
class Layout:
    """Where one deployment's files live."""

    name: str
    unit_dir: Path
    config_root: Path

    @property
    def unit(self) -> str:
        return unit_name(self.name)

    @property
    def unit_path(self) -> Path:
        return self.unit_dir / self.unit

    @property
    def config_dir(self) -> Path:
        return self.config_root / self.name

    @property
    def plan_path(self) -> Path:
        return self.config_dir / "plan.json"

    @classmethod
    def of(cls, name: str, environ: Mapping[str, str]) -> Layout:
        return cls(name, Path(environment.read("EDGECTL_UNIT_DIR", environ)), Path(environment.read("EDGECTL_CONFIG_DIR", environ)))

    def existing_plan(self) -> Plan | None:
        """The deployed plan, or None if there is none (or it does not read as a plan)."""
        try:
            return Plan.load(self.plan_path)
        except EdgectlError:
            return None


def deployment_names(environ: Mapping[str, str]) -> list[str]:
    root = Path(environment.read("EDGECTL_CONFIG_DIR", environ))
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob("*/plan.json"))


def service_memory(state: UnitState) -> TreeMem | None:
    cgroup = state.props.get("ControlGroup")
    if not cgroup:
        return None
    return cgroup_mem(cgroup)


def port_holder(host: str, port: int) -> str | None:
    """None if ``host:port`` can be bound, else a description of who holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise EdgectlError(f"--host {host} is not an address of this machine: use 127.0.0.1, 0.0.0.0 or one "
                                   "of its interfaces' addresses") from None
            if exc.errno != errno.EADDRINUSE:
                raise EdgectlError(f"cannot use {host}:{port}: {exc.strerror}") from None
    try:
        import psutil

        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                p = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({p.name()})"
    except Exception:  # who holds it is a courtesy; that it is held is the fact
        pass
    return "another program"
