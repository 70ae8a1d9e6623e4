"""Talking to systemd: ``systemctl`` and ``journalctl``, nothing else.

Every call goes through :class:`Systemd`, so deploy, status and the tests share one way
of reading a unit's state.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgectl.errors import EXIT_BAD_INPUT, EdgectlError

PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "StatusText", "NRestarts", "MainPID",
    "ControlGroup", "ActiveEnterTimestampMonotonic", "ExecMainStartTimestampMonotonic",
    "MemoryCurrent", "MemoryMax", "MemoryHigh", "FragmentPath", "UnitFileState",
)


@dataclass(frozen=True)
class UnitState:
    name: str
    props: dict[str, str]

    @property
    def active(self) -> str:
        return self.props.get("ActiveState", "")

    @property
    def sub(self) -> str:
        return self.props.get("SubState", "")

    @property
    def status_text(self) -> str:
        return self.props.get("StatusText", "")

    @property
    def main_pid(self) -> int:
        try:
            return int(self.props.get("MainPID", "0") or 0)
        except ValueError:
            return 0

    @property
    def restarts(self) -> int:
        try:
            return int(self.props.get("NRestarts", "0") or 0)
        except ValueError:
            return 0

    @property
    def loaded(self) -> bool:
        return self.props.get("LoadState") == "loaded"

    def int_prop(self, key: str) -> int | None:
        value = self.props.get(key, "")
        if not value or value in ("[not set]", "infinity"):
            return None
        try:
            return int(value)
        except ValueError:
            return None


def systemd_running() -> bool:
    """Whether a systemd manager answers here (PID 1, or the namespace we run in)."""
    try:
        r = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() in ("running", "degraded", "starting", "initializing", "maintenance")


class Systemd:
    def __init__(self, unit_dir: Path) -> None:
        self.unit_dir = unit_dir
        # Units under /run are runtime units: enabling them must be --runtime too.
        self.runtime = str(unit_dir).startswith("/run/")

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise EdgectlError(f"{args[0]} not found: edgectl deploy needs systemd (use `edgectl serve` without it)",
                               exit_code=EXIT_BAD_INPUT) from None
        if check and r.returncode != 0:
            raise EdgectlError(f"`{' '.join(args)}` failed: {(r.stderr or r.stdout).strip().splitlines()[-1:] or ''}",
                               exit_code=1)
        return r

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return self._run("systemctl", *args, check=check, timeout=timeout)

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload")

    def show(self, unit: str) -> UnitState:
        r = self.systemctl("show", unit, "-p", ",".join(PROPERTIES), check=False)
        props = {}
        for line in r.stdout.splitlines():
            key, _, value = line.partition("=")
            props[key] = value
        return UnitState(unit, props)

    def restart(self, unit: str) -> None:
        self.systemctl("restart", "--no-block", unit)

    def stop(self, unit: str) -> None:
        self.systemctl("stop", unit, check=False, timeout=300)

    def reset_failed(self, unit: str) -> None:
        self.systemctl("reset-failed", unit, check=False)

    def clean(self, unit: str) -> None:
        """Remove the unit's StateDirectory= and CacheDirectory= (a stopped unit only)."""
        self.systemctl("clean", "--what=all", unit, check=False)

    def enable(self, unit: str) -> None:
        args = ["enable", unit] if not self.runtime else ["enable", "--runtime", unit]
        self.systemctl(*args, check=False)

    def disable(self, unit: str) -> None:
        args = ["disable", unit] if not self.runtime else ["disable", "--runtime", unit]
        self.systemctl(*args, check=False)

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        args = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"]
        r = self._run(*args, check=False, timeout=30)
        return [line for line in r.stdout.splitlines() if line.strip()]

    def follow(self, unit: str, lines: int = 50) -> int:
        """``journalctl -f``: blocks until interrupted."""
        return subprocess.call(["journalctl", "-u", unit, "-n", str(lines), "-f", "--no-pager", "-o", "cat"])
